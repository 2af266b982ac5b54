"""Text <-> token ids, over a Hugging Face `tokenizers` tokenizer.json, and generated ids -> text deltas.

The text of generated tokens is what they add to the prompt's text: decode(prompt + output) minus
decode(prompt). Decoding the output alone is not that: Metaspace decoders (SentencePiece-style,
Llama/Mistral) drop the leading space of the first token they see ("best", not " best"), and a
byte-level token can finish a character the prompt began. So the output is always decoded after a
few prompt tokens of context (`context_ids`), as vLLM and TGI do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.decoders import DecodeStream

CONTEXT_TOKENS = 8  # prompt tokens decoded before the output (vLLM uses 5); more only when these show no text
UNFINISHED = "\ufffd"  # what a UTF-8 character cut short decodes to


class Tokenizer:
    """A tokenizer.json plus the id that ends a sequence."""

    # False in a subclass whose encode/decode add rules of their own around the tokenizer.json (fastai's
    # xxmaj/xxup): IncrementalDecoder then decodes through `decode`, never tokenizers' DecodeStream.
    decodes_in_rust = True
    # True where decoding reads the whole text (Moses detokenization pairs quotes, joins a word's pieces around
    # punctuation): IncrementalDecoder then decodes the whole output every step and holds back its last word.
    decodes_whole_text = False

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
        """Token ids; a ValueError for text the tokenizer cannot encode (a word-level vocabulary with no
        unknown-word token meeting a word it lacks)."""
        try:
            return self.hf.encode(text, add_special_tokens=add_special_tokens).ids
        except Exception as e:  # tokenizers raises a bare Exception
            raise ValueError(str(e)) from None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_continuation(self, prompt_ids: Sequence[int], ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text `ids` add after the prompt; what an IncrementalDecoder's deltas and flush add up to."""
        context, context_text = context_ids(self, prompt_ids, skip_special_tokens)
        return self.decode(context + ids, skip_special_tokens)[len(context_text) :]

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


def context_ids(tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool) -> tuple[list[int], str]:
    """The prompt's last tokens to decode the output after, and their text.

    A tail that shows no text (special tokens skipped, a lone Metaspace "▁") would leave the output's
    first token first in line, so the tail doubles until it shows some, or is the whole prompt. The
    text of a tail that starts mid-character begins with U+FFFD, harmlessly: only its end meets the output.
    """
    start = max(0, len(prompt_ids) - CONTEXT_TOKENS)
    while True:
        context = list(prompt_ids[start:])
        text = tokenizer.decode(context, skip_special_tokens)
        if text or start == 0:
            return context, text
        start = max(0, 2 * start - len(prompt_ids))


class IncrementalDecoder:
    """Turns generated token ids, one at a time, into text deltas that concatenate (with `flush()`) to
    decode(prompt + output) minus decode(prompt).

    TGI's prefix/read offsets: each token decodes the few ids since the text emitted before last, and
    the delta is what that text gained; a delta that ends in a cut UTF-8 character (U+FFFD) is held
    back until a later token completes it. The decoding runs in Rust (`tokenizers`' DecodeStream,
    one call per token, about half the cost of two Python-side decodes); the offsets are also kept
    here, so `flush()` can decode what is held back, and so a decoder whose text of a longer window
    does not extend the shorter one's (DecodeStream raises then) falls back to slicing, as TGI does.
    """

    __slots__ = ("_hf", "_skip_special_tokens", "_stream", "_ids", "_prefix_offset", "_read_offset", "_cut", "_whole",
                 "_emitted")

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self._hf = tokenizer.hf if tokenizer.decodes_in_rust else tokenizer  # what `decode`s and `decode_batch`es
        self._skip_special_tokens = skip_special_tokens
        context, context_text = context_ids(tokenizer, prompt_ids, skip_special_tokens)
        self._stream: DecodeStream | None = (DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
                                             if tokenizer.decodes_in_rust else None)
        self._ids = context  # context, then every pushed id
        self._prefix_offset = 0  # the text of ids[prefix_offset:read_offset] was emitted (or is context)
        self._read_offset = len(context)
        self._cut = 0  # characters of context text that the next deltas still repeat
        # A tokenizer whose rules read the whole text: (the context's text, what was emitted after it)
        self._whole = (context_text, "") if tokenizer.decodes_whole_text else None
        if context_text.endswith(UNFINISHED):
            # The prompt ends mid-character: DecodeStream then starts from no prefix and its first deltas
            # repeat the context's text (its half character completed). The contract's subtraction
            # counts characters, so as many are cut as the context's text had (U+FFFD included).
            self._read_offset, self._cut = 0, len(context_text)

    def push(self, token_id: int) -> str:
        """The text this token adds; "" while it (with those before) is held back."""
        self._ids.append(token_id)
        text = None
        if self._stream is not None:
            try:
                text = self._stream.step(self._hf, token_id)
            except Exception:  # noqa: BLE001 - DecodeStream's InvalidPrefix; never let it kill a step
                self._stream = None
        if self._whole is not None:
            return self._whole_delta(final=False)
        if self._stream is None:
            text = self._slice_delta(final=False)
        if text is None:
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        if self._cut:
            text, self._cut = text[self._cut :], max(0, self._cut - len(text))
        return text

    def peek(self, token_ids: Sequence[int]) -> list[str]:
        """The text each of `token_ids` would add if pushed now (with anything held back), pushing none;
        a character one leaves unfinished shows as U+FFFD, since nothing after it can complete it."""
        window = self._ids[self._prefix_offset :]
        prefix = len(self._hf.decode(self._ids[self._prefix_offset : self._read_offset], self._skip_special_tokens))
        texts = self._hf.decode_batch([window + [t] for t in token_ids], self._skip_special_tokens)
        return [text[prefix:][self._cut :] for text in texts]

    def flush(self) -> str:
        """Whatever is still held back (a character cut short at the very end decodes to U+FFFD)."""
        if self._whole is not None:
            return self._whole_delta(final=True)
        text = self._slice_delta(final=True)
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._stream = None  # it still holds what was flushed; any later push slices instead
        text, self._cut = text[self._cut :], max(0, self._cut - len(text))
        return text

    def _whole_delta(self, final: bool) -> str:
        """What the output adds to the text emitted so far, decoded whole; before the end, up to the space before
        its last word (that word's spacing, and the space, can still change: "Hello" then "," reads "Hello,")."""
        context_text, emitted = self._whole
        text = self._hf.decode(self._ids, self._skip_special_tokens)
        text = text[len(context_text):] if text.startswith(context_text) else text
        stable = text if final else text[: max(0, text.rfind(" "))]
        if not stable.startswith(emitted):
            return text[len(emitted):] if final else ""  # an earlier word changed: wait for the end
        self._whole = (context_text, stable)
        return stable[len(emitted):]

    def _slice_delta(self, final: bool) -> str | None:
        """What the ids since the read offset add, by two decodes; None while there is nothing to add."""
        window = self._ids[self._prefix_offset :]
        prefix = self._hf.decode(self._ids[self._prefix_offset : self._read_offset], self._skip_special_tokens)
        text = self._hf.decode(window, self._skip_special_tokens)
        if final or (len(text) > len(prefix) and not text.endswith(UNFINISHED)):
            return text[len(prefix) :]
        return None
