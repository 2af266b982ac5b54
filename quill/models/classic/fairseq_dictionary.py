"""fairseq's `dict.txt`, read as its `Dictionary` numbers the words, and made into a word tokenizer.

A `Dictionary` starts with four specials, `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, then one id per
line of dict.txt ("word count", optionally followed by the flag "#fairseq:overwrite"), in file order.
Preprocessing pads the vocabulary to a multiple of 8 with "madeupword0000", ... ; a file saved
without them is padded here to the model's embedding size, as fairseq does when it loads.

Text: words are split on whitespace, an unknown word reads as `<unk>`. fairseq's language-model data
is one sample per line with `</s>` appended, and it begins an inference prompt with `</s>`; so a
prompt here starts with `</s>` and each newline in it reads as `</s>` (a line break, to the model).
Generating `</s>` ends the sequence; decoded text leaves out `<s>`, `<pad>` and `</s>` but keeps
`<unk>`, which the WikiText data shows as a word.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import normalizers, processors

from quill.models.loading.errors import CheckpointError
from quill.models.text.tokenizer import Tokenizer

from .word_tokenizer import word_tokenizer

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
BOS, PAD, EOS, UNK = SPECIALS
OVERWRITE_FLAG = "#fairseq:overwrite"


def read_dictionary(path: Path) -> list[str]:
    """The words of dict.txt by id, the four specials first."""
    words = list(SPECIALS)
    seen = set(words)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"not a readable dictionary ({e})") from None
    for number, line in enumerate(lines, 1):
        line = line.rstrip()
        if not line:
            continue
        fields = line.rsplit(" ", 1)
        overwrite = len(fields) == 2 and fields[1] == OVERWRITE_FLAG
        if overwrite:
            fields = fields[0].rsplit(" ", 1)
        if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
            raise CheckpointError(path, f"line {number} is not 'word count': {line[:80]!r}")
        word = fields[0]
        if word in seen and not overwrite:
            raise CheckpointError(path, f"line {number}: {word!r} is listed twice (and not marked {OVERWRITE_FLAG})")
        seen.add(word)
        words.append(word)  # with the flag, fairseq gives the word a new id too (lookups take the first here)
    return words


def pad_dictionary(words: list[str], size: int, path: Path) -> list[str]:
    """`words` padded with fairseq's "madeupwordNNNN" entries to the model's `size` rows."""
    if len(words) > size:
        raise CheckpointError(path, f"{len(words)} words (with the 4 specials) but the model embeds only {size}")
    return words + [f"madeupword{i:04d}" for i in range(size - len(words))]


def dictionary_tokenizer(words: list[str]) -> Tokenizer:
    tokenizer = word_tokenizer(words, unk_token=UNK, eos_token=EOS, special_tokens=(BOS, PAD, EOS))
    tokenizer.hf.normalizer = normalizers.Replace("\n", f" {EOS} ")
    eos_id = words.index(EOS)
    tokenizer.hf.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", pair=f"{EOS} $A $B", special_tokens=[(EOS, eos_id)])
    return tokenizer
