"""Checkpoints of the classic LSTM and gated-CNN toolkits, read as they were saved and turned into Quill's own.

Each toolkit's format is a module here with a `FORMAT` (see `formats.py`): it recognises its files and
converts them into a Quill model, tokenizer and config (`Converted`), which `quill convert` writes as a
checkpoint directory and `quill serve` loads directly. Nothing is unpickled but through
`restricted_pickle`, which maps the classes a file names to inert stand-ins and never imports them.
"""
