"""Training pipeline behind `quill train`: corpus, tokenizer, bigram baseline, trainer, recipes."""
