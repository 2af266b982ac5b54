"""Loading a model to serve: where its files are (location.py: a directory, a bundled model, a hub id, a classic
toolkit's file), what they hold (checkpoint.py; Hugging Face's names and families in hf.py and hf_families.py;
weights.py, generation_config.py), and writing Quill's own checkpoints (saving.py)."""
