"""Text <-> token ids, over a Hugging Face `tokenizers` tokenizer.json."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    """A tokenizer.json plus the id that ends a sequence."""

    def __init__(self, hf_tokenizer: HFTokenizer, eos_token_id: int | None):
        self.hf = hf_tokenizer
        self.eos_token_id = eos_token_id

    @classmethod
    def from_file(cls, path: str | Path, eos_token_id: int | None) -> "Tokenizer":
        return cls(HFTokenizer.from_file(str(path)), eos_token_id)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def adds_bos(self, bos_token: str | None) -> bool:
        """Whether `encode` puts `bos_token` before the text (tokenizer.json's post-processor decides)."""
        bos_id = None if bos_token is None else self.token_to_id(bos_token)
        if bos_id is None:
            return False
        return self.encode("a")[:1] == [bos_id] and self.encode("a", add_special_tokens=False)[:1] != [bos_id]

    def save(self, path: str | Path) -> None:
        self.hf.save(str(path))


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas.

    Byte-level tokens can end halfway through a UTF-8 character; such a tail decodes
    to U+FFFD and is held back until the next token completes it, so the deltas
    concatenate to exactly the text of all the ids.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # ids before this are never decoded again
        self.read_offset = 0  # text of ids[prefix_offset:read_offset] has been emitted

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = lambda ids: self.tokenizer.decode(ids, self.skip_special_tokens)  # noqa: E731
        prefix = decode(self.ids[self.prefix_offset : self.read_offset])
        text = decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], self.skip_special_tokens)
        text = self.tokenizer.decode(self.ids[self.prefix_offset :], self.skip_special_tokens)
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :]
