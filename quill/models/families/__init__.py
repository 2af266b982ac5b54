"""The architectures, one module each: what a step of each computes from its inputs and its cached state (the
LSTM, the gated CNN, the Transformer and fairseq's fconv; Mamba, Mamba-2, xLSTM and LFM2, with their recurrences in
mamba_scan.py, ssd.py and mlstm.py), and the registry of their names (registry.py)."""
