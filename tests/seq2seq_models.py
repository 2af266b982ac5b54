"""Tiny random encoder-decoder checkpoints of each Hugging Face family, written by transformers itself, and
Quill's models loaded from them (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from quill.models.families.seq2seq import Seq2SeqTransformer
from quill.models.loading import hf
from quill.models.loading.weights import open_weights, read_weights

VOCAB = 300
SHAPES = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64)
# As the families' checkpoints have them: pad 1, end 2, the decoder starting from the end token (Marian: from pad)
IDS = dict(pad_token_id=1, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
START = {"marian": 1}


def hf_classes(family: str):
    import transformers as t

    return {"marian": (t.MarianConfig, t.MarianMTModel), "bart": (t.BartConfig, t.BartForConditionalGeneration),
            "mbart": (t.MBartConfig, t.MBartForConditionalGeneration),
            "m2m_100": (t.M2M100Config, t.M2M100ForConditionalGeneration),
            "t5": (t.T5Config, t.T5ForConditionalGeneration), "t5-gated": (t.T5Config, t.T5ForConditionalGeneration),
            "mt5": (t.MT5Config, t.MT5ForConditionalGeneration),
            "umt5": (t.UMT5Config, t.UMT5ForConditionalGeneration),
            "umt5-tied": (t.UMT5Config, t.UMT5ForConditionalGeneration),
            "fsmt": (t.FSMTConfig, t.FSMTForConditionalGeneration)}[family]


def _t5_shapes(family: str) -> dict:
    """T5's own names for the shapes, a head size apart from d_model / heads (as T5's d_kv may be); plain T5 and
    tied umT5 with more decoder layers than encoder ones (transformers' generate() then fails: its cache counts the
    encoder's)."""
    decoder_layers = 3 if family in ("t5", "umt5-tied") else 2
    return dict(d_model=32, d_kv=6, d_ff=48, num_layers=2, num_decoder_layers=decoder_layers, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=20, pad_token_id=0,
                eos_token_id=1, decoder_start_token_id=0,
                feed_forward_proj="relu" if family == "t5" else "gated-gelu")


def write_hf_model(directory: Path, family: str, vocab_size: int = VOCAB, seed: int = 0, **config):
    """A random `family` model saved in `directory`, its weights scaled up and its norms and biases perturbed so
    that its answers depend on the source and differ between tokens (defaults are near uniform). Returns the
    transformers model ("umt5": as transformers reads the files back)."""
    config_cls, model_cls = hf_classes(family)
    torch.manual_seed(seed)
    if family in ("t5", "t5-gated", "mt5", "umt5", "umt5-tied"):
        shapes = _t5_shapes(family)
    elif family == "fsmt":  # a vocabulary for each side, the target's the larger
        shapes = {**SHAPES, **IDS, "langs": ["en", "de"], "tgt_vocab_size": vocab_size,
                  "src_vocab_size": config.pop("src_vocab_size", vocab_size - 20)}
    else:
        shapes = {**SHAPES, **IDS, "decoder_start_token_id": START.get(family, 2)}
    sizes = {} if family == "fsmt" else {"vocab_size": vocab_size}
    model = model_cls(config_cls(**sizes, **{**shapes, **config})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name and family in ("marian", "m2m_100", "fsmt"):
                continue  # sinusoids, as the family computes them
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
            else:
                p.mul_(3)
        if getattr(model, "final_logits_bias", None) is not None:
            model.final_logits_bias.normal_()
        if family == "umt5":  # the hub's: an output layer of its own (transformers 5 can only build tied umT5s)
            model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * 3)
    model.save_pretrained(directory)
    if family == "umt5":
        return _as_hub_umt5(directory, model_cls)
    return model


def _as_hub_umt5(directory: Path, model_cls):
    """The config.json the hub's umT5 checkpoints have (transformers 4's: tie_word_embeddings false, which means
    untied logits, not scaled), and the model transformers reads from these files."""
    path = directory / "config.json"
    raw = json.loads(path.read_text())
    raw.pop("scale_decoder_outputs", None)
    path.write_text(json.dumps({**raw, "tie_word_embeddings": False}, indent=2))
    model = model_cls.from_pretrained(directory).eval()
    # transformers 5.17 has no scale_decoder_outputs (and reads this config untied, unscaled)
    assert model.lm_head.weight is not model.shared.weight and not getattr(model.config, "scale_decoder_outputs", False)
    return model


def load_quill_model(directory: Path, device: torch.device = torch.device("cpu")) -> Seq2SeqTransformer:
    """Quill's model of a written checkpoint, weights read as load_checkpoint reads them, float32 on `device`."""
    config, _ = hf.config_from_hf(json.loads((directory / "config.json").read_text()))
    with torch.device("meta"):
        model = Seq2SeqTransformer(config)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    with open_weights(directory) as tensors:
        state = read_weights(tensors, hf.tensor_sources(config, list(shapes), tensors.names), shapes, torch.float32,
                             device, label=directory.name)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def write_checkpoint(directory: Path, family: str, **tokenizer_options):
    """A whole checkpoint as the hub ships one: a tokenizer trained here (tests/seq2seq_fixtures.py) and a random
    model over its vocabulary with its special ids. Returns (the transformers model, the tokenizer's facts)."""
    from tests import seq2seq_fixtures

    writer = {"marian": seq2seq_fixtures.write_marian_tokenizer, "m2m_100": seq2seq_fixtures.write_m2m100_tokenizer,
              "fsmt": seq2seq_fixtures.write_fsmt_tokenizer}[family]
    info = writer(directory, **tokenizer_options)
    ids = {k: info[k] for k in ("pad_token_id", "eos_token_id", "decoder_start_token_id") if k in info}
    if family == "fsmt":  # a vocabulary for each side
        ids["src_vocab_size"] = info["src_vocab_size"]
    return write_hf_model(directory, family, vocab_size=info.get("vocab_size", info.get("tgt_vocab_size")), **ids), info
