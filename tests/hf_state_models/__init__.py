"""Tiny random-weight checkpoints of the state-space, xLSTM and short-convolution families, written by transformers'
own classes (`save_pretrained`), one module a family: for the model, engine and server tests and the benchmarks."""
