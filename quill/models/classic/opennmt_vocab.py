"""OpenNMT-py checkpoints unpickled without OpenNMT or torchtext, and their vocabularies in each of the forms they
were saved in (read by opennmt.py).

A checkpoint is a dict: `model` (the state dict less the generator), `generator`, `vocab`, `opt` (the training
options, an argparse.Namespace) and `optim`, unpickled with the rest but never used. `vocab` is, by version:
- v3: plain data, {"src": [token, ...], "tgt": [...], "src_feats": ..., "data_task": ..., "decoder_start_token"}.
- v1 and v2 (torchtext 0.4 and 0.5): torchtext objects, {"src": TextMultiField, "tgt": TextMultiField,
  "indices": Field, ...}: a TextMultiField's `fields` is [(name, Field)], the words' first, then each word
  feature's; a Field has its `vocab` (a torchtext Vocab: `itos`, the tokens by id) and its special tokens.
- earlier: a list of (name, Vocab) or (name, Field) pairs, or {"src": [(name, Field), ...], ...}.
The torchtext objects are rebuilt inert (restricted_pickle.py); so are the functions a Field keeps as its
tokenizer (OpenNMT's `_feature_tokenize`, bound by functools.partial), and torchtext 0.3's defaultdict of ids,
never called. Counter and OrderedDict are plain data to torch's unpickler.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quill.models.loading.errors import CheckpointError

from .restricted_pickle import PickledObject, attributes, load_restricted

VOCAB, FIELD, MULTI_FIELD = "torchtext.vocab.Vocab", "torchtext.data.field.Field", \
    "onmt.inputters.text_dataset.TextMultiField"
ALLOWED_CLASSES = (
    "argparse.Namespace",  # opt
    VOCAB, FIELD, MULTI_FIELD,
    "torchtext.data.field.RawField",  # v1's src_ex_vocab field
    "onmt.inputters.text_dataset._feature_tokenize",  # a Field's tokenizer, referred to and never called
    "torchtext.data.utils._split_tokenizer",  # torchtext's default tokenizer, likewise
    "torchtext.vocab._default_unk_index",  # torchtext 0.3's default id for unknown words, likewise
)
SPECIALS = {"unk": "<unk>", "pad": "<blank>", "bos": "<s>", "eos": "</s>"}  # OpenNMT's DefaultTokens


class _Partial(PickledObject):
    """functools.partial as stored: its function and arguments (pickled as a call with the function, then a
    state tuple), for reading, never calling."""

    qualified_name = "functools.partial"

    def __new__(cls, *args):
        return super().__new__(cls)

    def __setstate__(self, state) -> None:
        self.func, self.args, self.keywords, _ = state


class _DefaultDict:
    """collections.defaultdict as a plain dict of its items: torch's unpickler fills only plain dicts, and the
    default factory is dropped unread."""

    def __new__(cls, *args):
        return {}


CALLED_CLASSES = [(_Partial, "functools.partial"), (_DefaultDict, "collections.defaultdict")]


def load_checkpoint_dict(path: Path) -> dict:
    """The checkpoint's dict, every class in it one of ALLOWED_CLASSES or CALLED_CLASSES' names."""
    with torch.serialization.safe_globals(CALLED_CLASSES):
        checkpoint = load_restricted(path, ALLOWED_CLASSES)
    if not isinstance(checkpoint, dict):
        raise CheckpointError(path, f"holds a {type(checkpoint).__name__}, not an OpenNMT-py checkpoint dict")
    missing = [key for key in ("model", "generator", "vocab", "opt") if key not in checkpoint]
    if missing:
        raise CheckpointError(path, f"no {', '.join(missing)} in the checkpoint: not an OpenNMT-py .pt checkpoint"
                                    " (one saved with -save_format safetensors keeps its weights apart: not read)")
    return checkpoint


def _is(obj, qualified_name: str) -> bool:
    return isinstance(obj, PickledObject) and obj.qualified_name == qualified_name


def _is_pairs(obj) -> bool:
    return isinstance(obj, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in obj)


def _tokens(itos, path: Path, what: str) -> list[str]:
    if not isinstance(itos, list) or not all(isinstance(t, str) for t in itos):
        raise CheckpointError(path, f"the {what} vocabulary is not a list of strings")
    return itos


def _side(obj, path: Path, side: str) -> tuple[list[str], dict[str, str | None] | None, int]:
    """One side's tokens by id, its special tokens (None: v3's list, whose specials are OpenNMT's defaults), and
    how many word features it has beside the words."""
    what = {"src": "source", "tgt": "target"}[side]
    if isinstance(obj, list) and all(isinstance(t, str) for t in obj):  # v3
        return obj, None, 0
    features = 0
    if _is(obj, MULTI_FIELD):
        obj = attributes(obj).get("fields")
    if _is_pairs(obj) and obj:  # [(name, Field), (feature name, Field), ...]
        features, obj = len(obj) - 1, obj[0][1]
    if _is(obj, VOCAB):
        return _tokens(attributes(obj).get("itos"), path, what), dict(SPECIALS), features
    if not _is(obj, FIELD):
        raise CheckpointError(path, f"vocab[{side!r}] is a {getattr(obj, 'qualified_name', type(obj).__name__)}, "
                                    "not one of the forms OpenNMT-py saves (a token list, a torchtext Field)")
    fields = attributes(obj)
    if not _is(fields.get("vocab"), VOCAB):
        raise CheckpointError(path, f"the {what} field has no torchtext Vocab")
    specials = {name: fields.get(f"{attr}_token", SPECIALS[name])
                for name, attr in (("unk", "unk"), ("pad", "pad"), ("bos", "init"), ("eos", "eos"))}
    return _tokens(attributes(fields["vocab"]).get("itos"), path, what), specials, features


def read_vocabularies(vocab, path: Path) -> dict:
    """`vocab` of any form -> {"source", "target": token lists by id, "specials": the target's unk, pad, bos
    (OpenNMT's decoder start) and eos, "form": "v3" or "torchtext"}; word features are refused."""
    if _is_pairs(vocab):  # the oldest form: [(name, Vocab or Field), ...], features as separate names
        vocab = dict(vocab)
    if not isinstance(vocab, dict) or "src" not in vocab or "tgt" not in vocab:
        raise CheckpointError(path, "vocab holds no src and tgt vocabularies")
    features = sum(str(name).startswith("src_feat") for name in vocab if name != "src_feats")
    features += len(vocab.get("src_feats") or ())  # v3: a list (or a dict, in 3.0) of feature vocabularies
    source, _, source_features = _side(vocab["src"], path, "src")
    target, specials, _ = _side(vocab["tgt"], path, "tgt")
    form = "v3" if specials is None else "torchtext"
    if specials is None:
        specials = {**SPECIALS, "bos": vocab.get("decoder_start_token", SPECIALS["bos"])}
    if features + source_features:
        raise CheckpointError(path, f"{features + source_features} source word features (src_feats): Quill embeds "
                                    "words only")
    for name in ("bos", "eos"):
        if specials[name] not in target:
            raise CheckpointError(path, f"the target vocabulary has no {name} token {specials[name]!r}")
    return {"source": source, "target": target, "specials": specials, "form": form}
