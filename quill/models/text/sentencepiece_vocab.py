"""SentencePiece models as seq2seq checkpoints ship them: the model file read without protobuf (not a dependency
of Quill), encoding with `sentencepiece` itself (the exact pieces transformers' SentencePiece tokenizers get), and
`tokenizers` tokenizers over a vocabulary laid out in a checkpoint's own id order, which decode as transformers
does (and incrementally, through DecodeStream)."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import sentencepiece
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE, Unigram

from ..loading.errors import CheckpointError

SPIECE_UNDERLINE = "▁"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # SentencePiece's piece types
UNIGRAM, BPE_MODEL = 1, 2  # TrainerSpec.model_type


@dataclass
class SentencePieceModel:
    """What a .model/.spm file says, as far as tokenizing needs: its pieces and how it normalizes text."""

    path: Path
    pieces: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    types: list[int] = field(default_factory=list)
    model_type: int = UNIGRAM
    byte_fallback: bool = False
    precompiled_charsmap: bytes = b""
    remove_extra_whitespaces: bool = True
    processor: sentencepiece.SentencePieceProcessor | None = None

    def encode_pieces(self, text: str) -> list[str]:
        return self.processor.encode(text, out_type=str)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes):
    """(field number, value) of each field of a protobuf message, in order; a value is an int or bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        wire = key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, pos = data[pos : pos + width], pos + width
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated protobuf message")
        yield key >> 3, value


def read_sentencepiece(path: Path) -> SentencePieceModel:
    """The ModelProto fields that matter here (sentencepiece_model.proto): pieces (1: piece, score, type),
    trainer_spec (2: model_type 3, byte_fallback 35), normalizer_spec (3: precompiled_charsmap 2,
    remove_extra_whitespaces 4)."""
    if not path.is_file():
        raise CheckpointError(path, "missing: the checkpoint's SentencePiece model is needed for its tokenizer")
    data = path.read_bytes()
    model = SentencePieceModel(path)
    try:
        for number, value in _fields(data):
            if number == 1:
                piece, score, kind = "", 0.0, NORMAL
                for sub, sub_value in _fields(value):
                    if sub == 1:
                        piece = sub_value.decode("utf-8")
                    elif sub == 2:
                        score = struct.unpack("<f", sub_value)[0]
                    elif sub == 3:
                        kind = sub_value
                model.pieces.append(piece)
                model.scores.append(score)
                model.types.append(kind)
            elif number == 2:
                for sub, sub_value in _fields(value):
                    if sub == 3:
                        model.model_type = sub_value
                    elif sub == 35:
                        model.byte_fallback = bool(sub_value)
            elif number == 3:
                for sub, sub_value in _fields(value):
                    if sub == 2:
                        model.precompiled_charsmap = bytes(sub_value)
                    elif sub == 4:
                        model.remove_extra_whitespaces = bool(sub_value)
        model.processor = sentencepiece.SentencePieceProcessor(model_proto=data)
    except (ValueError, IndexError, UnicodeDecodeError, RuntimeError, struct.error) as e:
        raise CheckpointError(path, f"not a SentencePiece model ({e})") from None
    if not model.pieces:
        raise CheckpointError(path, "not a SentencePiece model (it has no pieces)")
    return model


def vocab_layout(vocab: dict, path: Path) -> list[str]:
    """A vocab.json's tokens in id order; its ids must run 0..n-1 (ids are rows of the model's embedding)."""
    if not all(isinstance(token, str) and isinstance(i, int) for token, i in vocab.items()):
        raise CheckpointError(path, "must map token strings to integer ids")
    layout = sorted(vocab, key=vocab.__getitem__)
    if [vocab[token] for token in layout] != list(range(len(layout))):
        raise CheckpointError(path, "its ids must run from 0 to the number of tokens minus one, each once")
    return layout


def added_token_pattern(tokens) -> re.Pattern | None:
    """Splits text at added tokens as transformers does before tokenizing the rest: leftmost match first, the
    longest token where two start at the same place."""
    tokens = sorted({t for t in tokens if t}, key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, tokens)) + ")") if tokens else None


class SentencePieceEncoder:
    """Text -> ids as transformers' SentencePiece tokenizers (Marian, M2M100) make them: the text is cut at added
    tokens, each other chunk is encoded by SentencePiece, and each piece is looked up in the checkpoint's own
    vocabulary (its ids are not SentencePiece's), an unknown piece becoming the unknown token."""

    def __init__(self, spm: SentencePieceModel, ids: dict[str, int], unk_id: int, added: dict[str, int],
                 language_codes: bool = False):
        self.spm, self.ids, self.unk_id, self.added = spm, ids, unk_id, added
        self.pattern = added_token_pattern(added)
        self.language_codes = language_codes  # Marian: a chunk's leading ">>fra<<" is one token

    def encode(self, text: str) -> list[int]:
        chunks = self.pattern.split(text) if self.pattern else [text]
        ids = []
        for i, chunk in enumerate(chunks):
            if i % 2:  # re.split puts the matched added tokens at odd positions
                ids.append(self.added[chunk])
                continue
            if not chunk:
                continue
            pieces = []
            if self.language_codes and chunk.startswith(">>") and (end := chunk.find("<<")) != -1:
                pieces.append(chunk[: end + 2])
                chunk = chunk[end + 2 :]
            pieces += self.spm.encode_pieces(chunk)
            ids += [self.ids.get(piece, self.unk_id) for piece in pieces]
        return ids


def _bpe_merges(spm: SentencePieceModel, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """SentencePiece BPE has no merge list: a piece is the merge of two pieces, ranked by the piece's score."""
    normal = {p: (s, i) for i, (p, s, t) in enumerate(zip(spm.pieces, spm.scores, spm.types))
              if t == NORMAL and p in vocab}
    ranked = []
    for piece, (score, index) in normal.items():
        for cut in range(1, len(piece)):
            if piece[:cut] in normal and piece[cut:] in normal:
                ranked.append((-score, index, piece[:cut], piece[cut:]))
    return [(left, right) for _, _, left, right in sorted(ranked)]


def spm_tokenizer(layout: list[str], spm: SentencePieceModel, unk_token: str, specials, pipeline: str,
                  bpe: bool | None = None, lstrip=(), normalized=()) -> HFTokenizer:
    """A `tokenizers` tokenizer over `layout` (the checkpoint's tokens in id order) with SentencePiece's pieces
    (a BPE model when `bpe`, which defaults to the spm's own type; else Unigram with the spm's scores: pieces the
    spm lacks get scores too low to be chosen over its own). `specials` (end of sequence, padding, language
    tokens...) are added as special, so decoding with skip_special_tokens drops them; those in `lstrip` take the
    spaces before them, those in `normalized` match the normalized text (both as transformers makes <mask>).
    `pipeline`:

    - "sentencepiece": as transformers' SentencePiece tokenizers (Marian, M2M100), which decode with spm and strip
      the result: spaces at either end are dropped, not only the first piece's. Stripping the end holds a trailing
      space back until text follows it, so incremental decoding still adds up to the whole. Encoding (of stop
      strings) normalizes whitespace as SentencePiece does.
    - "t5", "mbart", "fairseq": as transformers' T5Tokenizer, MBartTokenizer and MBart50/NllbTokenizer build their
      tokenizers from a SentencePiece model (for checkpoints without tokenizer.json)."""
    if unk_token not in layout:
        raise CheckpointError(spm.path, f"the vocabulary has no unknown token {unk_token!r}")
    if bpe is None:
        bpe = spm.model_type == BPE_MODEL
    if bpe:
        vocab = {token: i for i, token in enumerate(layout)}
        model = BPE(vocab=vocab, merges=_bpe_merges(spm, vocab), unk_token=unk_token, fuse_unk=True,
                    byte_fallback=spm.byte_fallback, dropout=None)
    else:
        known = {p: s for p, s, t in zip(spm.pieces, spm.scores, spm.types) if t in (NORMAL, USER_DEFINED, BYTE)}
        floor = -1e6  # below any path through the model's own pieces
        model = Unigram([(token, known.get(token, floor)) for token in layout], layout.index(unk_token),
                        spm.byte_fallback)
    tokenizer = HFTokenizer(model)
    steps = [normalizers.Precompiled(spm.precompiled_charsmap)] if spm.precompiled_charsmap else []
    if pipeline == "mbart":  # transformers' MBartTokenizer leaves the text unnormalized
        steps = []
    elif pipeline == "sentencepiece" and spm.remove_extra_whitespaces:  # no space at either end, none doubled
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    elif pipeline == "fairseq":
        steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    if steps:
        tokenizer.normalizer = normalizers.Sequence(steps)
    metaspace = dict(replacement=SPIECE_UNDERLINE, prepend_scheme="always", split=True)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(**metaspace)
    if pipeline in ("t5", "mbart"):
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                           pre_tokenizers.Metaspace(**metaspace)])
    if pipeline == "sentencepiece":
        # (decoders.Strip would do, but panics on a text of spaces only, tokenizers 0.23)
        steps = [decoders.Replace(SPIECE_UNDERLINE, " "), decoders.Fuse(), decoders.Replace(Regex(r"\A +| +\z"), "")]
    else:
        steps = [decoders.Metaspace(**metaspace)]
    tokenizer.decoder = decoders.Sequence(([decoders.ByteFallback()] if spm.byte_fallback else []) + steps)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=t in normalized, lstrip=t in lstrip)
                                  for t in dict.fromkeys(specials)])
    return tokenizer
