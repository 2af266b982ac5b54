"""The text rules of an OpenNMT-py model, as its training options name them, for toolkit_tokenizer.json.

OpenNMT-py v2 and v3 apply `transforms` on the fly: "sentencepiece" (a model per side, `src_subword_model` and
`tgt_subword_model`) or "bpe" (subword-nmt codes, "@@ " marks); v1 models were trained on text tokenized before
training, split here on spaces. The options keep the training machine's paths: the files are looked for beside the
checkpoint under their own names. "onmt_tokenize" (the OpenNMT Tokenizer, pyonmttok) is refused: its rules are not
reproduced here. A source gets nothing appended; the decoder starts from <s>.
"""

from __future__ import annotations

from pathlib import Path, PureWindowsPath

from quill.models.loading.errors import CheckpointError

SUBWORD_TRANSFORMS = ("sentencepiece", "bpe")


def _beside(model_file: Path, option: str, options: dict, what: str) -> Path:
    named = options.get(option)
    if not isinstance(named, str) or not named:
        raise CheckpointError(model_file, f"the `{what}` transform names no {option}")
    file = model_file.parent / PureWindowsPath(named).name  # a path of the training machine, either kind of slash
    if not file.is_file():
        raise CheckpointError(file, f"missing: the model was trained with the `{what}` transform on {named!r}; "
                                    "put that file beside the checkpoint")
    return file


def text_rules(options: dict, vocabularies: dict, model_file: Path) -> dict:
    """The toolkit_tokenizer.json description (quill/models/text/toolkit_tokenizer.py) of this model's text."""
    transforms = [str(t) for t in options.get("transforms") or []]
    if "onmt_tokenize" in transforms:
        raise CheckpointError(model_file, "the `onmt_tokenize` transform (OpenNMT Tokenizer) is not reproduced by "
                                          "Quill: models trained with sentencepiece, bpe or text split on spaces are")
    subword = [t for t in transforms if t in SUBWORD_TRANSFORMS]
    if len(subword) > 1:
        raise CheckpointError(model_file, f"transforms {transforms}: more than one subword transform")
    spec = {"toolkit": "opennmt", "source_vocab": vocabularies["source"], "target_vocab": vocabularies["target"],
            "specials": {name: vocabularies["specials"][name] for name in ("unk", "pad", "bos", "eos")},
            "source_suffix": [], "languages": None, "moses": False, "lowercase": False, "bpe_codes": None,
            "sentencepiece": None}
    if subword == ["sentencepiece"]:
        spec["sentencepiece"] = {side: str(_beside(model_file, f"{prefix}_subword_model", options, "sentencepiece"))
                                 for side, prefix in (("source", "src"), ("target", "tgt"))}
    elif subword == ["bpe"]:
        source = _beside(model_file, "src_subword_model", options, "bpe")
        target = _beside(model_file, "tgt_subword_model", options, "bpe")
        if source.read_bytes() != target.read_bytes():
            raise CheckpointError(target, "source and target BPE codes differ: Quill reads joint codes only")
        spec["bpe_codes"] = str(source)
    return spec
