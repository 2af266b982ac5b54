"""Benchmarks of the engine against Hugging Face and against the hardware's limits (see README.md)."""
