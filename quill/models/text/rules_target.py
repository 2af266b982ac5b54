"""The target side of a translation model whose text rules run in Python (FSMT's, fairseq's and OpenNMT's Moses
and BPE): generated ids -> tokens -> text by the toolkit's own detokenization.

`side` is any object with `encode(text) -> ids` (stop strings) and `detokenize(tokens) -> text`.
"""

from __future__ import annotations

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from .tokenizer import Tokenizer


def _clean_up_spaces(text: str) -> str:
    """transformers' clean_up_tokenization, for a tokenizer_config.json that asks for it."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class RulesTarget(Tokenizer):
    """A target side as a quill Tokenizer: tokens decoded (and stop strings encoded) by `side`, a toolkit's text
    rules run in Python (Moses, BPE marks); `hf` is a word-level tokenizer over `layout`, for the vocabulary's sake."""

    decodes_in_rust = False
    decodes_whole_text = True

    def __init__(self, side, layout: list[str], unk: str, special_ids: set[int], eos_id: int,
                 clean_up: bool):
        hf = HFTokenizer(WordLevel({token: i for i, token in enumerate(layout)}, unk_token=unk))
        hf.add_special_tokens([layout[i] for i in sorted(special_ids)])
        super().__init__(hf, eos_id)
        self.side, self._layout, self._unk, self._special_ids, self._clean_up = side, layout, unk, special_ids, clean_up

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.side.encode(text)  # the decoder's ids take no special tokens around them

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        layout, n = self._layout, len(self._layout)
        tokens = [layout[i] if 0 <= i < n else self._unk for i in ids
                  if not (skip_special_tokens and i in self._special_ids)]
        text = self.side.detokenize(tokens)
        return _clean_up_spaces(text) if self._clean_up else text

    def decode_batch(self, batch: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]
