"""The vocabulary description llguidance needs, from the `tokenizers` object behind a Quill tokenizer.

llguidance reads byte-level BPE tokenizers from their JSON itself. It does not know the Metaspace decoder
(SentencePiece-like tokenizers, as Llama's and Mistral's converted ones), so for those each token's bytes are
given by hand: "▁" is a space and "<0xNN>" is byte NN, which is what their decoder makes of them. Word-level
tokenizers (quill/models/classic/word_tokenizer.py) put a space between words only, not before the first one, so
no fixed bytes per token describe their text: a constraint on such a model is refused.
"""

from __future__ import annotations

import json
import re

from llguidance import LLTokenizer, TokenizerWrapper

from quill.models.text.tokenizer import Tokenizer

from .grammar_source import GrammarError

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class _PieceVocabulary:
    """The attributes TokenizerWrapper reads, for a tokenizer whose pieces spell "▁" for a space."""

    def __init__(self, tokenizer: Tokenizer, eos_token_id: int, vocab_size: int):
        hf = tokenizer.hf
        self.eos_token_id = eos_token_id
        self.bos_token_id = None
        special = {token_id for token_id, added in hf.get_added_tokens_decoder().items() if added.special}
        pieces = [hf.id_to_token(i) for i in range(vocab_size)]  # None past the tokenizer: never allowed
        self.special_token_ids = sorted(special | {i for i, p in enumerate(pieces) if p is None})
        # llguidance marks a special token by a leading 0xFF byte (never in UTF-8 text).
        self.tokens = [b"\xff" + (p or "").encode() if i in special or p is None else piece_bytes(p)
                       for i, p in enumerate(pieces)]
        self._ids = {}
        for i, spelled in enumerate(self.tokens):
            if i not in special and spelled:
                self._ids.setdefault(spelled, i)
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, text: str | bytes) -> list[int]:
        """Greedy longest-match ids for the text. The tokenizer's own encode would not do: it prepends a "▁"
        to a text's start, and llguidance tokenizes pieces of the grammar, which are not a text's start."""
        data = text.encode() if isinstance(text, str) else text
        ids, i = [], 0
        while i < len(data):
            for size in range(min(self._longest, len(data) - i), 0, -1):
                token = self._ids.get(data[i:i + size])
                if token is not None:
                    ids.append(token)
                    i += size
                    break
            else:
                i += 1  # a byte no token spells: it cannot be produced, nor matched
        return ids


def piece_bytes(piece: str) -> bytes:
    byte = _BYTE_TOKEN.fullmatch(piece)
    return bytes([int(byte.group(1), 16)]) if byte else piece.replace("\u2581", " ").encode()


def grammar_tokenizer(tokenizer: Tokenizer, eos_token_ids: list[int], vocab_size: int) -> LLTokenizer:
    """llguidance's tokenizer for a model whose output layer has `vocab_size` rows (>= the tokenizer's ids)."""
    eos = list(eos_token_ids) or None
    description = json.loads(tokenizer.hf.to_str())
    if description["model"]["type"] == "WordLevel":
        raise GrammarError("this model's word-level tokenizer cannot follow a grammar (its words have no fixed "
                           "spelling in bytes: spaces go between them)")
    if "ByteLevel" in json.dumps(description.get("decoder")):
        return LLTokenizer(tokenizer.hf.to_str(), n_vocab=vocab_size, eos_token=eos)
    wrapper = TokenizerWrapper(_PieceVocabulary(tokenizer, (eos or [0])[0], vocab_size))
    return LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos)
