"""Text: tokenizers (tokenizer.py, over a tokenizer.json, with incremental detokenization), what a checkpoint says of
its special tokens and chat templates (tokenizer_config.py), and chat messages rendered into prompts
(chat_template.py)."""
