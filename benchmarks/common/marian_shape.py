"""A random-weight Marian translation model (OPUS-MT en-de's shape) as a Hugging Face directory with a real
sentencepiece tokenizer, its CTranslate2 conversion, and token-id sources drawn from its pieces.

The directory is what `MarianMTModel.from_pretrained`, `MarianTokenizer.from_pretrained` (AutoTokenizer), CTranslate2's
`TransformersConverter` and `quill serve` all read: config.json, generation_config.json, model.safetensors, source.spm,
target.spm (one sentencepiece model for both sides, as a shared-vocabulary OPUS-MT model has) and vocab.json.
The sentencepiece model is trained in about a second on a made-up corpus (pseudo-words from syllables, Zipf
frequencies, a fixed seed), so nothing is downloaded and the pieces never change with the repository's text.
vocab.json maps `</s>` to 0 and `<unk>` to 1 (as OPUS-MT's does), the trained pieces to the ids after them, then
filler entries up to the model's vocabulary, and `<pad>` to the last id (Marian's decoder start and padding), so
every id a model can produce maps to a token on every side.

Directories are cached under a folder the caller names, keyed by the shape, and rebuilt when missing or half-written.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import shutil
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

FORMAT = 2  # bump when what is written changes: older cached directories are then rebuilt under a new key
EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
READY = "complete.json"  # written last: a directory without it is half-written and is rebuilt


@dataclass(frozen=True, slots=True)
class MarianShape:
    """The model's sizes. Defaults: Helsinki-NLP/opus-mt-en-de (74M parameters)."""

    name: str = "opus-mt-en-de"
    encoder_layers: int = 6
    decoder_layers: int = 6
    d_model: int = 512
    heads: int = 8
    ffn: int = 2048
    vocab_size: int = 58_101  # the last id is <pad>
    max_positions: int = 512
    pieces: int = 4_000  # sentencepiece pieces asked for (fewer when the made-up corpus cannot give that many)
    # Weights drawn wider than transformers' 0.02, at which a random Marian (its output layer the scaled input
    # embedding's transpose) answers nearly every source with the same token repeated; at 0.1 the token depends on the
    # source, so comparing engines' outputs means something. Much wider (0.5) saturates attention's softmax and
    # float32 rounding then flips tokens between engines (logits differ by up to 11 there, by 1e-4 at 0.1).
    init_std: float = 0.1
    seed: int = 0

    @property
    def key(self) -> str:
        blob = json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True).encode()
        return f"{self.name}-{hashlib.sha256(blob).hexdigest()[:12]}"

    def describe(self) -> str:
        return (f"Marian {self.encoder_layers}+{self.decoder_layers} layers, d_model {self.d_model}, "
                f"{self.heads} heads, ffn {self.ffn}, vocabulary {self.vocab_size:,}, random weights "
                f"(seed {self.seed}, std {self.init_std})")


OPUS_EN_DE = MarianShape()
# Seconds to build and run (--smoke): its outputs vary within a sentence too at std 0.2
TINY = MarianShape(name="tiny-marian", encoder_layers=2, decoder_layers=2, d_model=64, heads=4, ffn=256,
                   vocab_size=1_000, pieces=800, init_std=0.2)

_CONSONANTS, _VOWELS = "bcdfghjklmnprstvwyz", "aeiou"
_EXTRA = ["th", "sch", "ng", "st", "er", "en", "ch", "qu", "x", "ei", "ie", "au"]


def made_up_corpus(seed: int, lines: int, words: int) -> list[str]:
    """Sentences of pseudo-words (syllables joined), word frequencies falling as 1/rank, some punctuation."""
    rng = random.Random(seed)
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS] + _EXTRA
    lexicon = ["".join(rng.choice(syllables) for _ in range(rng.choice((1, 1, 2, 2, 2, 3, 4)))) for _ in range(words)]
    weights = [1 / (rank + 1) for rank in range(words)]
    out = []
    for _ in range(lines):
        text = " ".join(rng.choices(lexicon, weights, k=rng.randint(3, 24)))
        out.append(text.capitalize() + rng.choice(".....?!,;:") + rng.choice(["", "", "", " 1990", " (x)", " \"ok\""]))
    return out


def train_sentencepiece(shape: MarianShape) -> bytes:
    """A unigram sentencepiece model (Marian's kind) trained on `made_up_corpus` (sized to the pieces asked for: 4.7 s
    for OPUS-MT's shape's 4,000, 0.4 s for TINY's 800); its serialized bytes."""
    import sentencepiece as spm

    model = io.BytesIO()
    corpus = made_up_corpus(shape.seed, lines=5 * shape.pieces, words=min(6_000, 3 * shape.pieces // 2))
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=shape.pieces,
        model_type="unigram", character_coverage=1.0, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, num_threads=1,
        hard_vocab_limit=False, minloglevel=2)
    return model.getvalue()


def build_vocab(spm_bytes: bytes, vocab_size: int) -> dict[str, int]:
    """</s> 0, <unk> 1, the sentencepiece pieces in their order, filler up to vocab_size - 1, <pad> last."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    vocab = {EOS: 0, UNK: 1}
    for piece in pieces[:vocab_size - 3]:
        vocab.setdefault(piece, len(vocab))
    while len(vocab) < vocab_size - 1:
        vocab[f"<filler{len(vocab)}>"] = len(vocab)
    vocab[PAD] = vocab_size - 1
    return vocab


def marian_config(shape: MarianShape):
    from transformers import MarianConfig

    pad = shape.vocab_size - 1
    return MarianConfig(
        vocab_size=shape.vocab_size, decoder_vocab_size=shape.vocab_size, d_model=shape.d_model,
        encoder_layers=shape.encoder_layers, decoder_layers=shape.decoder_layers,
        encoder_attention_heads=shape.heads, decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.ffn, decoder_ffn_dim=shape.ffn, activation_function="swish",
        max_position_embeddings=shape.max_positions, static_position_embeddings=True, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, init_std=shape.init_std,
        pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=None, bos_token_id=None,
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0)


def _write(directory: Path, shape: MarianShape) -> None:
    from transformers import GenerationConfig, MarianMTModel, MarianTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    spm_bytes = train_sentencepiece(shape)
    scratch = directory / "tokenizer-sources"
    scratch.mkdir()
    for side in ("source.spm", "target.spm"):
        (scratch / side).write_bytes(spm_bytes)
    (scratch / "vocab.json").write_text(json.dumps(build_vocab(spm_bytes, shape.vocab_size), ensure_ascii=False))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*sacremoses.*")
        tokenizer = MarianTokenizer(*(str(scratch / f) for f in ("source.spm", "target.spm", "vocab.json")))
    tokenizer.save_pretrained(directory)
    shutil.rmtree(scratch)

    torch.manual_seed(shape.seed)
    model = MarianMTModel(marian_config(shape)).eval()
    pad = shape.vocab_size - 1
    # OPUS-MT's generation settings, less its length limits (each engine is told its exact length): <pad> is never
    # generated (CTranslate2 drops its row from the output layer; transformers is told so here).
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]], decoder_start_token_id=pad, eos_token_id=0, pad_token_id=pad, num_beams=4,
        max_length=shape.max_positions)
    model.save_pretrained(directory, safe_serialization=True)


def ensure_marian(cache_root: Path, shape: MarianShape, log=lambda message: None) -> Path:
    """The shape's Hugging Face directory under `cache_root`, built there if missing or incomplete."""
    directory = Path(cache_root) / shape.key / "hf"
    if (directory / READY).is_file():
        return directory
    log(f"building {shape.describe()} in {directory} ...")
    partial = directory.with_name("hf.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    partial.mkdir(parents=True)
    _write(partial, shape)
    (partial / READY).write_text(json.dumps({"format": FORMAT, **asdict(shape)}, indent=2) + "\n")
    partial.rename(directory)
    return directory


def ensure_ctranslate2(hf_dir: Path, log=lambda message: None) -> Path:
    """The directory converted by CTranslate2's TransformersConverter in float32 (no quantization), cached beside it."""
    import ctranslate2

    out = Path(hf_dir).with_name("ct2-float32")
    if (out / READY).is_file():
        return out
    log(f"converting {hf_dir} with ctranslate2 {ctranslate2.__version__} (float32) ...")
    partial = out.with_name("ct2-float32.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*sacremoses.*")
        ctranslate2.converters.TransformersConverter(str(hf_dir)).convert(str(partial), quantization="float32")
    (partial / READY).write_text(json.dumps({"ctranslate2": ctranslate2.__version__}) + "\n")
    partial.rename(out)
    return out


@dataclass(frozen=True, slots=True)
class Vocab:
    """Ids and pieces of a directory's vocab.json."""

    pieces: list[str]  # by id
    ids: dict[str, int]
    real: range  # ids of the trained sentencepiece pieces (not </s>, <unk>, filler or <pad>)

    @classmethod
    def read(cls, hf_dir: Path) -> "Vocab":
        ids = json.loads((Path(hf_dir) / "vocab.json").read_text())
        pieces = [""] * len(ids)
        for piece, i in ids.items():
            pieces[i] = piece
        filler = next((i for i, p in enumerate(pieces) if p.startswith("<filler")), len(pieces) - 1)
        return cls(pieces, ids, range(2, filler))

    def to_pieces(self, ids: list[int]) -> list[str]:
        return [self.pieces[i] for i in ids]

    def to_ids(self, pieces: list[str]) -> list[int]:
        return [self.ids[p] for p in pieces]


def random_sources(vocab: Vocab, count: int, lengths: tuple[int, int], seed: int) -> list[list[int]]:
    """`count` sources of uniform random lengths in `lengths` (inclusive, </s> included), ids drawn uniformly from
    the trained pieces, each ending with </s> (id 0) as MarianTokenizer ends an encoded sentence."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randint(*lengths)
        out.append([rng.choice(vocab.real) for _ in range(n - 1)] + [vocab.ids[EOS]])
    return out
