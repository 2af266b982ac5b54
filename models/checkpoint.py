"""Checkpoint directories: config.json + model.safetensors + tokenizer.json.

Our own checkpoints and Hugging Face GPT-2/Llama directories load through the same
function. Nothing is ever unpickled. Every problem is one `CheckpointError` naming
the file and what is wrong with it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from . import hf
from .registry import ARCHITECTURES
from .tokenizer import Tokenizer

BUNDLED_DIR = Path(__file__).parent / "checkpoints"  # the default models that ship with Quill
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
FORMAT_VERSION = 1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointError(Exception):
    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


@dataclass
class LoadedModel:
    name: str
    path: Path
    architecture: str
    model: nn.Module
    tokenizer: Tokenizer
    eos_token_ids: list[int]
    device: torch.device
    dtype: torch.dtype
    metadata: dict = field(default_factory=dict)

    @property
    def max_seq_len(self) -> int | None:
        """Longest sequence the model can attend over; None for recurrent/convolutional state."""
        return getattr(self.model.config, "max_seq_len", None) if self.model.state_kind == "paged_kv" else None

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def resolve_checkpoint_path(name_or_path: str | Path) -> Path:
    """A checkpoint directory, or the name of a bundled one (e.g. "shakespeare-lstm")."""
    path = Path(name_or_path)
    if not path.exists() and (BUNDLED_DIR / path).is_dir():
        return BUNDLED_DIR / path
    return path


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA device is available")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, not {dtype!r}")
    return DTYPES[dtype]


def _read_json(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(path, f"not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(path, "must hold a JSON object")
    return raw


def read_config(path: Path) -> tuple[str, object, list[int], dict]:
    """config.json -> (architecture, config dataclass, end-of-sequence ids, metadata)."""
    raw = _read_json(path)
    try:
        if hf.is_hf_config(raw):
            config, eos = hf.config_from_hf(raw)
            return "transformer", config, eos, {"hf_architectures": raw.get("architectures", [])}
        arch = raw.get("architecture")
        if arch not in ARCHITECTURES:
            raise CheckpointError(path, f"unknown architecture {arch!r} (known: {', '.join(ARCHITECTURES)})")
        config_cls, _ = ARCHITECTURES[arch]
        config = config_cls(**raw.get("config", {}))
        eos = raw.get("eos_token_id")
        return arch, config, [] if eos is None else [eos], raw.get("metadata", {})
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(path, f"invalid model configuration: {e}") from None


def _expected_sources(architecture: str, config, model: nn.Module, names: set[str]) -> list[hf.TensorSource]:
    if getattr(config, "extra", {}).get("hf_model_type"):
        return hf.tensor_sources(config, names)
    return [hf.TensorSource(n, [n], hf._single) for n, _ in model.named_parameters()]


def _read_weights(path: Path, architecture: str, config, model: nn.Module, dtype, device) -> dict[str, torch.Tensor]:
    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except Exception as e:  # safetensors raises its own error types for a corrupt header
        raise CheckpointError(path, f"not a readable safetensors file ({e})") from None
    with handle as f:
        names = set(f.keys())
        params = dict(model.named_parameters())
        weights = {}
        for source in _expected_sources(architecture, config, model, names):
            missing = [s for s in source.sources if s not in names]
            if missing:
                raise CheckpointError(path, f"missing tensor {missing[0]!r}")
            tensor = source.combine([f.get_tensor(s) for s in source.sources])
            expected = tuple(params[source.name].shape)
            if tuple(tensor.shape) != expected:
                raise CheckpointError(
                    path, f"tensor {', '.join(source.sources)} has shape {tuple(tensor.shape)}, expected {expected}"
                )
            if not tensor.is_floating_point():
                raise CheckpointError(path, f"tensor {source.sources[0]!r} has dtype {tensor.dtype}, expected floating point")
            weights[source.name] = tensor.to(device=device, dtype=dtype)
    return weights


def load_checkpoint(
    path: str | Path, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto", name: str | None = None
) -> LoadedModel:
    """Load a checkpoint directory (or bundled model name) for inference (eval mode)."""
    path = resolve_checkpoint_path(path)
    if not path.is_dir():
        raise CheckpointError(path, "no such checkpoint directory")
    for file in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE):
        if not (path / file).is_file():
            raise CheckpointError(path / file, "missing file")
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    architecture, config, eos_ids, metadata = read_config(path / CONFIG_FILE)

    try:
        tokenizer = Tokenizer.from_file(path / TOKENIZER_FILE, eos_ids[0] if eos_ids else None)
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise CheckpointError(path / TOKENIZER_FILE, f"not a readable tokenizer ({e})") from None
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(
            path / TOKENIZER_FILE,
            f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary has only {config.vocab_size}",
        )

    _, model_cls = ARCHITECTURES[architecture]
    with torch.device("meta"):
        model = model_cls(config)
    weights = _read_weights(path / WEIGHTS_FILE, architecture, config, model, dtype, device)
    model.load_state_dict(weights, strict=True, assign=True)
    model.eval().requires_grad_(False)
    return LoadedModel(
        name=name or path.name, path=path, architecture=architecture, model=model, tokenizer=tokenizer,
        eos_token_ids=eos_ids, device=device, dtype=dtype, metadata=metadata,
    )


def save_checkpoint(
    directory: str | Path,
    architecture: str,
    model: nn.Module,
    tokenizer: Tokenizer,
    dtype: torch.dtype = torch.float16,
    metadata: dict | None = None,
) -> Path:
    """Write a checkpoint directory that `load_checkpoint` reads back."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "format_version": FORMAT_VERSION,
        "architecture": architecture,
        "config": asdict(model.config),
        "eos_token_id": tokenizer.eos_token_id,
        "metadata": metadata or {},
    }
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    tensors = {n: p.detach().to("cpu", dtype).contiguous() for n, p in model.named_parameters()}
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    tokenizer.save(directory / TOKENIZER_FILE)
    return directory
