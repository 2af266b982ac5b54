"""One joint SentencePiece model for an encoder-decoder's source and target text, and the toolkit_tokenizer.json spec
(quill/models/text/toolkit_tokenizer.py) that serves it: both vocabularies are its pieces in its id order.

The specials take fairseq's ids, <s> 0, <pad> 1, </s> 2, <unk> 3, so the families' defaults (fconv's positions
from pad + 1, decoding from a start id) read as they do for fairseq's checkpoints. Identity normalization: the
target's case and punctuation are what is being learned, and every line round-trips (checked on training).
"""

import io
from collections.abc import Iterable
from pathlib import Path

import sentencepiece

SPECIALS = {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>"}
SPECIAL_IDS = {"bos": 0, "pad": 1, "eos": 2, "unk": 3}


def train_sentencepiece(texts: Iterable[str], vocab_size: int) -> bytes:
    """A unigram model of `vocab_size` pieces (the specials among them), as the bytes of its .model file."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, normalization_rule_name="identity", num_threads=1, minloglevel=2,
        **{f"{name}_id": i for name, i in SPECIAL_IDS.items()},
        **{f"{name}_piece": piece for name, piece in SPECIALS.items()},
    )
    return model.getvalue()


def load_or_train_sentencepiece(path: Path, texts: list[str], vocab_size: int) -> sentencepiece.SentencePieceProcessor:
    """Reuse the model at `path` if it has `vocab_size` pieces, else train one there; every text must round-trip."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(train_sentencepiece(texts, vocab_size))
    model = sentencepiece.SentencePieceProcessor(model_file=str(path))
    if model.get_piece_size() != vocab_size:
        raise RuntimeError(f"{path} has {model.get_piece_size()} pieces, not {vocab_size}; delete it")
    broken = next((text for text in texts if model.decode(model.encode(text)) != text), None)
    if broken is not None:
        raise RuntimeError(f"{path} does not round-trip {broken!r}")
    return model


def pieces(model: sentencepiece.SentencePieceProcessor) -> list[str]:
    return [model.id_to_piece(i) for i in range(model.get_piece_size())]


def toolkit_spec(model: sentencepiece.SentencePieceProcessor, model_path: Path) -> dict:
    """toolkit_tokenizer.json's contents for a model whose two sides share `model` (at `model_path`): sources end
    with </s>, as fairseq's do; no Moses, no BPE codes, no language pair."""
    vocab = pieces(model)
    return {
        "toolkit": "quill", "source_vocab": vocab, "target_vocab": vocab, "specials": dict(SPECIALS),
        "source_suffix": [SPECIALS["eos"]], "languages": None, "moses": False, "lowercase": False,
        "bpe_codes": None, "sentencepiece": {"source": str(model_path), "target": str(model_path)},
    }
