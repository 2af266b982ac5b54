"""Checkpoint directories: config.json + weights (model.safetensors, or shards) + tokenizer.json.

Our own checkpoints and Hugging Face checkpoints of the supported families load through
the same function, from a directory, a bundled model's name or a hub id in the local
Hugging Face cache. Beside the model and tokenizer, a Hugging Face checkpoint brings its
generation_config.json (more end-of-sequence ids, sampling defaults) and its
tokenizer_config.json and chat templates. Nothing is unpickled here (a classic toolkit's checkpoint
is converted first, quill/models/classic, through an allow-list). A converted checkpoint may name text rules its
tokenizer applies around tokenizer.json (metadata "text_rules": fastai's case markers). Every problem is one
`CheckpointError` naming the file and what is wrong with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..attention import select_attention_backend
from ..families.registry import ARCHITECTURES
from ..kernels import select_layer_ops
from ..kernels.narrow_weights import cpu_has_bf16, narrow_linear_weights, narrows_weights
from ..kernels.ops_linear import route_linears
from ..state import holds_kv
from ..text.tokenizer import Tokenizer
from ..text.tokenizer_config import read_tokenizer_config
from . import hf
from .errors import CheckpointError, read_json_object
from .generation_config import bad_word_sequences, banned_tokens, check_token_ids, read_generation_config
from .location import BUNDLED_DIR, ModelLocation, locate
from .saving import CONFIG_FILE, TOKENIZER_FILE, save_checkpoint
from .weights import WEIGHTS_FILE, has_weights, open_weights, read_weights

# BUNDLED_DIR, CheckpointError and save_checkpoint live in their own modules and are imported from here too.
__all__ = ["BUNDLED_DIR", "CheckpointError", "GENERATION_CONFIG_MODES", "LoadedModel", "load_checkpoint",
           "resolve_checkpoint_path", "save_checkpoint"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
log = logging.getLogger(__name__)

GENERATION_CONFIG_MODES = ("auto", "none")  # vLLM's --generation-config: apply the checkpoint's defaults, or not


@dataclass
class LoadedModel:
    name: str
    path: Path
    architecture: str
    model: nn.Module
    tokenizer: Tokenizer
    eos_token_ids: list[int]  # config.json's, then generation_config.json's: any of them ends a sequence
    device: torch.device
    dtype: torch.dtype  # of its arithmetic, activations and caches
    metadata: dict = field(default_factory=dict)
    model_id: str = ""  # as asked for: hub id ("org/name"), bundled name or directory; default: the path
    revision: str | None = None  # commit of the hub snapshot it was loaded from
    # SamplingParams field -> the checkpoint's recommended value (generation_config.json), for a request
    # that leaves the setting out; empty with --generation-config none.
    generation_defaults: dict = field(default_factory=dict)
    # Tokens never generated (generation_config.json's one-token bad_words_ids); empty with --generation-config none,
    # as are the next two.
    banned_token_ids: list[int] = field(default_factory=list)
    bad_words_ids: list[list[int]] = field(default_factory=list)  # its longer bad words, banned in every request
    forced_eos_token_ids: list[int] = field(default_factory=list)  # a sequence's last allowed token (forced_eos)
    beam_defaults: dict = field(default_factory=dict)  # how generate() decodes it unasked (GenerationConfig)
    max_length: int | None = None  # generation_config.json's, counting the prompt
    special_tokens: dict[str, str] = field(default_factory=dict)  # "bos_token" -> "<s>", ... (what templates see)
    chat_templates: dict[str, str] = field(default_factory=dict)  # name -> Jinja source; the main one is "default"
    add_bos_token: bool = False  # tokenizer.encode(text) starts with bos_token (so a rendered template must not)
    weights_dtype: torch.dtype | None = None  # its linear weights' where that differs (narrow_weights.py)
    # An encoder-decoder model's tokenizers: its sources' ids and languages (`tokenizer` is its target side's)
    seq2seq: object = None  # Seq2SeqTokenizer (quill/models/text/seq2seq_tokenizer.py)

    def __post_init__(self):
        self.model_id = self.model_id or str(self.path or self.name)

    @property
    def chat_template(self) -> str | None:
        """The checkpoint's main chat template, or None if it has none."""
        return self.chat_templates.get("default")

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def max_seq_len(self) -> int | None:
        """Longest sequence the model can attend over; None for recurrent/convolutional state."""
        return getattr(self.model.config, "max_seq_len", None) if holds_kv(self.model) else None

    @property
    def is_encoder_decoder(self) -> bool:
        return self.seq2seq is not None

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def resolve_checkpoint_path(name_or_path: str | Path) -> Path:
    """A checkpoint directory, the name of a bundled one (e.g. "shakespeare-lstm"), or a hub id in the HF cache."""
    return locate(name_or_path).path


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """The device asked for, a CUDA one always with its index (streams, graphs and set_device need one)."""
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for but no CUDA device is available")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def keep_float32_exact(device: torch.device, dtype: torch.dtype) -> None:
    """A float32 model on CUDA computes in float32: cuDNN rounds convolutions' and LSTMs' inputs to TF32 by default
    (matmuls already stay float32), so an engine would answer differently from its own full forward, and from
    another process's engine. Process-wide, and harmless beside bf16 or fp16 models: TF32 is for float32 only."""
    if device.type == "cuda" and dtype == torch.float32:
        torch.backends.cudnn.allow_tf32 = False


# Families that `auto` serves in bfloat16 on a CPU with bfloat16 arithmetic (AVX-512-BF16 or AMX), as vLLM does
# there: on such a CPU the GPT-2-shape Transformer ran at 1.6x its float32 rate beside vLLM, and the bundled models'
# held-out perplexity moved by 0.01% at most (docs/performance.md). The other families, not measured in bfloat16
# there yet, stay float32, as every family does on CPUs without bfloat16 arithmetic.
CPU_BFLOAT16_AUTO = frozenset({"transformer"})


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, architecture: str | None = None) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if architecture in CPU_BFLOAT16_AUTO and cpu_has_bf16() else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, not {dtype!r}")
    return DTYPES[dtype]


def read_config(path: Path) -> tuple[str, object, list[int], dict]:
    """config.json -> (architecture, config dataclass, end-of-sequence ids, metadata)."""
    raw = read_json_object(path)
    quantization = raw.get("quantization_config")
    if quantization is not None:
        method = quantization.get("quant_method", "unknown") if isinstance(quantization, dict) else "unknown"
        raise CheckpointError(
            path, f"quantized checkpoint (quantization_config, method {method!r}): "
                  "Quill serves float32, float16 and bfloat16 weights only"
        )
    try:
        if hf.is_hf_config(raw):
            config, eos = hf.config_from_hf(raw)
            return hf.family_of(raw).architecture, config, eos, {"hf_architectures": raw.get("architectures", [])}
        arch = raw.get("architecture")
        if arch not in ARCHITECTURES:
            raise CheckpointError(path, f"unknown architecture {arch!r} (known: {', '.join(ARCHITECTURES)})")
        config_cls, _ = ARCHITECTURES[arch]
        config = config_cls(**raw.get("config", {}))
        eos = raw.get("eos_token_id")
        return arch, config, [] if eos is None else [eos], raw.get("metadata", {})
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(path, f"invalid model configuration: {e}") from None


def expected_sources(config, model: nn.Module, names: set[str]) -> list[hf.TensorSource]:
    params = [n for n, _ in model.named_parameters()]
    if getattr(config, "extra", {}).get("hf_model_type"):
        return hf.tensor_sources(config, params, names)
    return [hf.same_name(n) for n in params]


def _read_seq2seq_tokenizer(path: Path):
    """An encoder-decoder checkpoint's tokenizers: a converted toolkit model's rules (toolkit_tokenizer.json), else
    the files its Hugging Face family ships (no tokenizer.json needed)."""
    from ..text.toolkit_tokenizer import TOOLKIT_TOKENIZER_FILE, load_toolkit_tokenizer

    if (path / TOOLKIT_TOKENIZER_FILE).is_file():
        return load_toolkit_tokenizer(path)
    from ..text.seq2seq_tokenizer import load_seq2seq_tokenizer

    return load_seq2seq_tokenizer(path, read_json_object(path / CONFIG_FILE))


def _read_tokenizer(path: Path, eos_ids: list[int], vocab_size: int) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_file(path, eos_ids[0] if eos_ids else None)
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise CheckpointError(path, f"not a readable tokenizer ({e})") from None
    if tokenizer.vocab_size > vocab_size:
        raise CheckpointError(
            path, f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary has only {vocab_size}"
        )
    return tokenizer


def load_checkpoint(
    path: str | Path | ModelLocation,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    name: str | None = None,
    generation_config: str = "auto",
    attention_backend: str = "auto",
    layer_ops: str = "auto",
    weights: bool = True,
    revision: str | None = None,
) -> LoadedModel:
    """Load a checkpoint (directory, bundled model name or hub id, or where `locate` found one) for
    inference (eval mode).

    `generation_config`: "auto" takes the checkpoint's sampling defaults from
    generation_config.json, "none" leaves them out; its end-of-sequence ids count either way.
    `attention_backend`: how a Transformer's steps read its paged cache, a key of
    models.attention.ATTENTION_BACKENDS or "auto" (the device's default); checked here, so a
    backend that cannot run on the device fails the load.
    `layer_ops`: how a Transformer's steps run norms, RoPE, the gated activation and linear layers (the other
    families: their linear layers), a key of models.kernels.LAYER_OPS or "auto" (fused Triton kernels on CUDA,
    oneDNN linears on the CPU).
    `weights`: False loads everything but the weights (the model stays on the meta device): for a
    process that tokenizes and validates while another process runs the model.
    `revision`: for a hub id, the branch, tag or commit (or a unique prefix of a cached one) to
    read; None reads main. A `ModelLocation` is read as it is, its revision already resolved: two
    processes that load one model read the same snapshot even if its branch moves in between.
    """
    if generation_config not in GENERATION_CONFIG_MODES:
        raise ValueError(f"generation_config must be one of {GENERATION_CONFIG_MODES}, not {generation_config!r}")
    if isinstance(path, ModelLocation):
        if revision is not None:
            raise ValueError(f"revision {revision} was asked for, but {path.model_id} is already located")
        location = path
    else:
        location = locate(path, revision)
    path = location.path
    # A hub snapshot's directory is named after a commit: name the model after its hub id.
    # A converted classic checkpoint's directory is named after a hash: name it after the original.
    name = name or (location.model_id if location.revision else
                    Path(location.model_id).name if location.converted else path.name)
    if path.is_file():
        raise CheckpointError(path, "a file, not a checkpoint directory nor a classic toolkit's checkpoint "
                                    "(PyTorch word_language_model, fastai AWD-LSTM)")
    if not path.is_dir():
        raise CheckpointError(path, "no such checkpoint directory")
    if not (path / CONFIG_FILE).is_file():
        raise CheckpointError(path / CONFIG_FILE, "missing file")
    if not has_weights(path):
        raise CheckpointError(path / WEIGHTS_FILE, "missing file")
    device = resolve_device(device)
    architecture, config, eos_ids, metadata = read_config(path / CONFIG_FILE)
    dtype = resolve_dtype(dtype, device, architecture)
    narrow = narrows_weights(device, dtype)  # bfloat16 asked for where the CPU has no bfloat16 arithmetic
    if narrow:
        dtype = torch.float32
    keep_float32_exact(device, dtype)
    generation = read_generation_config(path)
    check_token_ids(generation, config.vocab_size, path)
    eos_ids += [i for i in generation.eos_token_ids if i not in eos_ids]
    tokenizer_config = read_tokenizer_config(path)
    seq2seq = None
    _, model_cls = ARCHITECTURES[architecture]
    if getattr(model_cls, "is_encoder_decoder", False):  # source and target tokenizers as the family ships them
        seq2seq = _read_seq2seq_tokenizer(path)
        tokenizer = seq2seq.target
    elif not (path / TOKENIZER_FILE).is_file():
        raise CheckpointError(path / TOKENIZER_FILE, "missing file")
    else:
        tokenizer = _read_tokenizer(path / TOKENIZER_FILE, eos_ids, config.vocab_size)
    if metadata.get("text_rules"):  # a classic toolkit's rules around the vocabulary (fastai's case markers)
        from ..classic.text_rules import with_text_rules

        try:
            tokenizer = with_text_rules(metadata["text_rules"], tokenizer)
        except ValueError as e:
            raise CheckpointError(path / CONFIG_FILE, str(e)) from None

    with torch.device("meta"):
        model = model_cls(config)
    if weights:
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        with open_weights(path) as tensors:
            try:
                sources = expected_sources(config, model, tensors.names)
            except ValueError as e:
                raise CheckpointError(path / CONFIG_FILE, str(e)) from None
            model.load_state_dict(read_weights(tensors, sources, shapes, dtype, device, label=name),
                                  strict=True, assign=True)
    model.eval().requires_grad_(False)
    ops = select_layer_ops(layer_ops, device)
    route_linears(model, ops)  # the families that call their linear modules run them through the ops too
    if narrow:
        count = narrow_linear_weights(model)
        log.info("%s: this CPU has no bfloat16 arithmetic: %d linear weights kept in bfloat16, widened to float32 "
                 "for each product; activations and caches float32", name, count)
    if holds_kv(model):  # only models with attention layers have an attention backend to choose
        model.attention_backend = select_attention_backend(attention_backend, device).name
    if holds_kv(model) or hasattr(model, "layer_ops"):  # the families that hand their weights to the ops
        model.layer_ops = ops
    return LoadedModel(
        name=name, path=path, architecture=architecture, model=model, tokenizer=tokenizer,
        eos_token_ids=eos_ids, device=device, dtype=dtype, metadata=metadata, model_id=location.model_id,
        revision=location.revision,
        generation_defaults=generation.defaults if generation_config == "auto" else {},
        banned_token_ids=banned_tokens(generation) if generation_config == "auto" else [],
        bad_words_ids=bad_word_sequences(generation) if generation_config == "auto" else [],
        forced_eos_token_ids=generation.forced_eos_token_ids if generation_config == "auto" else [],
        beam_defaults=generation.beam_defaults if generation_config == "auto" else {},
        max_length=generation.max_length if generation_config == "auto" else None,
        special_tokens=tokenizer_config.special_tokens, chat_templates=tokenizer_config.chat_templates,
        add_bos_token=tokenizer.adds_bos(tokenizer_config.special_tokens.get("bos_token")), seq2seq=seq2seq,
        weights_dtype=torch.bfloat16 if narrow else None,
    )
