"""The models the benchmarks run: a random GPT-2, Llama, Mamba, Mamba-2, LFM2 or xLSTM saved as a Hugging Face
directory, and the LSTM / gated-CNN defaults (bundled checkpoints when present, random weights otherwise).

Throughput does not depend on what the weights are, only on their shapes, so random
weights measure the same work as trained ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from quill.models.loading.checkpoint import BUNDLED_DIR, LoadedModel, load_checkpoint
from quill.models.families.registry import ARCHITECTURES
from quill.models.text.tokenizer import Tokenizer

EOS = "<|endoftext|>"  # id 0: the first special token
REPO_ROOT = Path(__file__).resolve().parent.parent

# Used only when neither a bundled checkpoint nor the training recipes are there, and by --smoke.
TINY_SHAPES = {
    "lstm": dict(d_embed=16, d_hidden=24, n_layers=2, d_proj=16),
    "gcnn": dict(d_embed=16, d_model=24, n_blocks=2, layers_per_block=2, kernel_size=3),
}
TINY_VOCAB = 300


def build_tokenizer(vocab_size: int) -> HFTokenizer:
    """A byte-level BPE trained in a fraction of a second on Quill's own source files.

    Topped up with filler tokens to exactly `vocab_size`, so that every id a random model
    can produce decodes to text, as every id of the real GPT-2 tokenizer does.
    """
    package = REPO_ROOT / "quill"
    sources = sorted((package / "models").glob("*.py")) + sorted((package / "server").rglob("*.py"))
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((p.read_text() for p in sources), trainer)
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_tokens([f"<filler{i}>" for i in range(missing)])
    return tok


# Family -> (transformers config class, model class): the random checkpoints the benchmarks build.
HF_FAMILIES = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
               "mamba": ("MambaConfig", "MambaForCausalLM"), "mamba2": ("Mamba2Config", "Mamba2ForCausalLM"),
               "lfm2": ("Lfm2Config", "Lfm2ForCausalLM"), "xlstm": ("xLSTMConfig", "xLSTMForCausalLM")}


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def save_random_model(directory: Path, family: str, config_kwargs: dict, seed: int = 0,
                      device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """Write a randomly initialised transformers model of `family` + tokenizer.json; returns the model (eval mode).

    The weights are made on `device` in `dtype` (an 8B model is made on the GPU in a second, and never
    exists in float32). The caller loads the same directory with `load_checkpoint`, so both sides run
    identical weights.
    """
    import transformers

    if family not in HF_FAMILIES:
        raise ValueError(f"unknown model family {family!r} (known: {', '.join(HF_FAMILIES)})")
    config_name, model_name = HF_FAMILIES[family]
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(**config_kwargs, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    with torch.device(device), _default_dtype(dtype):
        model = getattr(transformers, model_name)(config).eval().requires_grad_(False)
    if family == "xlstm":
        randomize_xlstm_gates(model)
    # Never stop early: lengths must be exactly what each request asked for (Quill's ignore_eos).
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    directory = Path(directory)
    model.save_pretrained(directory, safe_serialization=True)
    build_tokenizer(config.vocab_size).save(str(directory / "tokenizer.json"))
    return model


def randomize_xlstm_gates(model) -> None:
    """Draw a transformers xLSTM's input and forget gates at random, as its other weights are: transformers starts
    them at zero weights (and biases of -10)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "gate_preact" in name and "ogate" not in name:
                param.normal_(0.0, 0.02 if name.endswith("weight") else 1.0)


def save_random_gpt2(directory: Path, config_kwargs: dict, seed: int = 0):
    """A random GPT2LMHeadModel, float32 on the CPU (see `save_random_model`)."""
    return save_random_model(directory, "gpt2", config_kwargs, seed)


def load_recurrent(architecture: str, kind: str) -> tuple[LoadedModel, str]:
    """The LSTM or gated-CNN default as float32 on the CPU, and a line saying where it came from.

    kind "default": the bundled checkpoint if it exists, else random weights of its recipe's shapes;
    kind "tiny": tiny random weights (smoke runs).
    """
    name = f"shakespeare-{architecture}"
    if kind == "default" and (BUNDLED_DIR / name).is_dir():
        return load_checkpoint(name, device="cpu", dtype="float32"), f"bundled checkpoint {name}"
    shapes, vocab_size, source = TINY_SHAPES[architecture], TINY_VOCAB, "tiny random weights"
    if kind == "default":
        try:  # the recipes the bundled checkpoints are trained from
            from quill.models.training.bpe import DEFAULT_VOCAB_SIZE
            from quill.models.training.recipes import get_recipe

            shapes, vocab_size = dict(get_recipe(name).model), DEFAULT_VOCAB_SIZE
            source = f"random weights with the shapes of {name} (no bundled checkpoint yet)"
        except ImportError:
            source = f"tiny random weights ({name} and its recipe are missing)"
    config_cls, model_cls = ARCHITECTURES[architecture]
    torch.manual_seed(0)
    model = model_cls(config_cls(vocab_size=vocab_size, **shapes)).eval().requires_grad_(False)
    tokenizer = Tokenizer(build_tokenizer(vocab_size), eos_token_id=0)
    loaded = LoadedModel(
        name=name, path=Path(name), architecture=architecture, model=model, tokenizer=tokenizer,
        eos_token_ids=[0], device=torch.device("cpu"), dtype=torch.float32,
    )
    return loaded, source


def gpt2_source(config: dict) -> str:
    """Where the GPT-2-shape model came from, as tables print it."""
    return f"random weights, GPT-2 shape, {config['vocab_size']:,}-token vocabulary (Hugging Face directory)"


def describe_model(loaded: LoadedModel, source: str) -> dict:
    """Architecture, size and dtype of a loaded model, for the JSON and the tables."""
    params = list(loaded.model.parameters())
    return {
        "architecture": loaded.architecture,
        "source": source,
        "parameters": loaded.num_parameters,
        "weight_bytes": sum(p.numel() * p.element_size() for p in params),
        "dtype": str(loaded.dtype).removeprefix("torch."),
    }
