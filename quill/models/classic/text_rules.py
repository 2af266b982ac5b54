"""Text rules a converted checkpoint's tokenizer keeps around its tokenizer.json, by the name its config's
metadata gives them (`text_rules`); load_checkpoint wraps the tokenizer it read in them."""

from __future__ import annotations

from quill.models.text.tokenizer import Tokenizer

from .fastai_text import FastaiTokenizer

TEXT_RULES = {FastaiTokenizer.text_rules: FastaiTokenizer}


def with_text_rules(name: str, tokenizer: Tokenizer) -> Tokenizer:
    if name not in TEXT_RULES:
        raise ValueError(f"unknown text_rules {name!r} (known: {', '.join(TEXT_RULES)})")
    return TEXT_RULES[name](tokenizer)
