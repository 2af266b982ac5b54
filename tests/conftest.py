"""Shared fixtures: tiny tokenizers (byte-level, Metaspace), tiny random and scripted models, a live server.

`QUILL_TEST_DEVICE=cuda make test` runs the model, engine, sampling and API tests on CUDA: everything
that builds a model, an engine or a server takes its device from `TEST_DEVICE` (the CPU by default,
as CI runs). Triton kernels are tested on a GPU where there is one, else in the Triton interpreter.
"""

from __future__ import annotations

import copy
import os
import shutil
from contextlib import contextmanager
import signal
import socket
import subprocess
import sys
import tempfile

import pytest
import torch

from quill.clients.ready import wait_until_ready
from quill.models.loading.checkpoint import keep_float32_exact, save_checkpoint
from quill.models.families.registry import ARCHITECTURES
from quill.models.text.tokenizer import Tokenizer
from tests.tiny_tokenizers import (METASPACE_SPECIALS, TEXT, build_hf_tokenizer,  # noqa: F401 (tests import them here)
                                   build_metaspace_tokenizer)

# One CPU thread for the tests and the servers they start: their models are tiny, and on a busy machine two threads
# wait on each other's OpenMP barriers (a tiny LSTM's step went from 0.3 ms to 90 ms with another job on the cores).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))



@contextmanager
def torch_threads(count: int):
    """torch's CPU thread count set to `count` for the block, then put back."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


TEST_DEVICE = torch.device(os.environ.get("QUILL_TEST_DEVICE", "cpu"))
# Full float32 on CUDA, as load_checkpoint makes it for a float32 model: TF32's rounding (errors near 1e-3) would
# hide real differences between a model's full forward and its serving step. Tests build most models directly.
keep_float32_exact(TEST_DEVICE, torch.float32)
KERNEL_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if KERNEL_DEVICE.type == "cpu":
    # Read by triton.jit when a kernel module is imported, which happens only once a test runs a kernel.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Small configs of every architecture and every Transformer flavour.
TINY_CONFIGS = {
    "lstm": ("lstm", dict(d_embed=16, d_hidden=24, n_layers=2, d_proj=16)),
    "lstm-untied": ("lstm", dict(d_embed=16, d_hidden=24, n_layers=1, tie_embeddings=False)),
    "lstm-layer-sizes": ("lstm", dict(d_embed=16, layer_sizes=[24, 20, 16], output_bias=True)),
    "gcnn": ("gcnn", dict(d_embed=16, d_model=24, n_blocks=2, layers_per_block=2, kernel_size=3)),
    "gcnn-k1": ("gcnn", dict(d_embed=24, d_model=24, n_blocks=1, layers_per_block=1, kernel_size=1)),
    "transformer-llama": ("transformer", dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)),
    "transformer-gpt2": (
        "transformer",
        dict(d_model=32, n_layers=2, n_heads=4, positional="learned", norm="layernorm", gated_mlp=False,
             activation="gelu_tanh", attn_bias=True, mlp_bias=True, max_seq_len=64),
    ),
    "transformer-post-norm": (  # the original layout, as PyTorch's word_language_model TransformerModel
        "transformer",
        dict(d_model=32, n_layers=2, n_heads=4, positional="sinusoidal", norm="layernorm", post_norm=True,
             final_norm=False, gated_mlp=False, activation="relu", attn_bias=True, mlp_bias=True,
             embed_scale=32 ** 0.5, tie_embeddings=False, output_bias=True, max_seq_len=64),
    ),
}


# The CPU's C++ kernels: only a machine without a C++ compiler may lack them; where there is one, a failed build
# fails the tests that use them.
needs_cxx = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                               reason="no C++ compiler to build the CPU's kernels with")


@pytest.fixture(scope="session", autouse=True)
def cpu_kernels():
    """The CPU's C++ kernels (attention, state steps) built before the first test, side by side (about 30 s on a
    fresh machine, then cached), not inside a test that waits on a server with a deadline; for each, the module or
    the reason it cannot build."""
    from concurrent.futures import ThreadPoolExecutor

    from quill.models.attention.cpu_kernel import kernel
    from quill.models.kernels.cpu_state_steps import steps

    with ThreadPoolExecutor(2) as pool:  # each build is a compiler process: threads overlap them
        return list(pool.map(lambda build: build(), [kernel, steps]))


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return Tokenizer(build_hf_tokenizer(), eos_token_id=0)


@pytest.fixture(scope="session")
def metaspace_tokenizer() -> Tokenizer:
    return Tokenizer(build_metaspace_tokenizer(), eos_token_id=METASPACE_SPECIALS.index("</s>"))


def build_tiny_model(key: str, vocab_size: int = 300, seed: int = 0, device: torch.device | str = TEST_DEVICE):
    """Random weights from `seed` (the same on every device: made on the CPU, then moved)."""
    arch, kwargs = TINY_CONFIGS[key]
    config_cls, model_cls = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    model = model_cls(config_cls(vocab_size=vocab_size, **kwargs)).eval()
    return arch, model.to(device)


def on_test_device(module: torch.nn.Module) -> torch.nn.Module:
    """`module` on TEST_DEVICE: a copy unless that is the CPU, so a session-wide reference model stays where it is."""
    return module if TEST_DEVICE.type == "cpu" else copy.deepcopy(module).to(TEST_DEVICE)


def build_scripted_transformer(vocab_size: int, cycle: list[int], seed: int = 0):
    """A Transformer whose greedy next token depends on the current token only: each id of `cycle` is
    followed by the next (the last by the first), any other id by itself. So a test knows the output
    ids without asking the server.

    Its layers are zeroed (each adds nothing to the residual stream), so the last hidden state is the
    current token's unit-length embedding; row j of the untied output matrix holds the embedding of the
    token that j follows, and that row wins the dot product by a wide margin (random unit vectors in 32
    dimensions are far from parallel)."""
    config_cls, model_cls = ARCHITECTURES["transformer"]
    torch.manual_seed(seed)
    model = model_cls(config_cls(vocab_size=vocab_size, d_model=32, n_layers=1, n_heads=4, tie_embeddings=False))
    with torch.no_grad():
        for p in model.layers.parameters():
            p.zero_()
        embed = torch.nn.functional.normalize(torch.randn(vocab_size, 32), dim=-1)
        follows = list(range(vocab_size))  # follows[j]: the token that j comes after
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            follows[b] = a
        model.embed.weight.copy_(embed)
        model.lm_head.weight.copy_(10 * embed[follows])
    return "transformer", model.eval()


# ---- tiny checkpoints on disk, and a real server over them -------------------------------

TINY = {"tiny-transformer": "transformer-gpt2", "tiny-lstm": "lstm", "tiny-gcnn": "gcnn"}


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, tiny_tokenizer) -> dict[str, str]:
    root = tmp_path_factory.mktemp("checkpoints")
    paths = {}
    for name, key in TINY.items():
        arch, model = build_tiny_model(key, tiny_tokenizer.vocab_size)
        with torch.no_grad():
            model.embed.weight.mul_(0.5)
        paths[name] = str(save_checkpoint(root / name, arch, model, tiny_tokenizer, dtype=torch.float32))
    return paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """`quill serve` in a subprocess on a loopback port (`module`: the one run with -m, quill's command line
    by default)."""

    def __init__(self, tiny_checkpoints, *extra: str, env: dict | None = None, module: str = "quill.cli"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, "-m", module, "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--device", str(TEST_DEVICE), "--dtype", "float32", "--cache-bytes", str(4 * 2**20), "--block-size", "4",
                "--max-tokens-limit", "256", "--drain-seconds", "5"]
        for name, path in tiny_checkpoints.items():
            args += ["--model", f"{name}={path}"]
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty server never blocks on it
        self.process = subprocess.Popen(
            args + list(extra), stdout=self.log, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})},
        )

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def __enter__(self) -> "LiveServer":
        """`with LiveServer(...) as server:` waits until it is ready and stops it on the way out."""
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_ready(self, timeout: float = 180.0 if TEST_DEVICE.type == "cuda" else 60.0) -> None:
        # on a GPU each model loads in an engine process of its own, profiles its memory and captures graphs:
        # five state models took over a minute on the H100
        try:
            wait_until_ready(self.url, timeout, still_starting=lambda: self.process.poll() is None)
        except RuntimeError:
            raise RuntimeError(f"server exited: {self.output()}") from None

    def exit_code(self, timeout: float) -> int | None:
        """The server's exit code once it exits by itself within `timeout` seconds; None if it is still running."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.output()


@pytest.fixture(scope="module")
def live_server(tiny_checkpoints):
    with LiveServer(tiny_checkpoints) as server:
        yield server


# ---- tiny Hugging Face checkpoints in a hub cache, served by hub id ------------------------


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory):
    """(cache directory, {hub id: HubCheckpoint}) of tests/hub_checkpoints.py's tiny checkpoints."""
    from tests.hub_checkpoints import write_hub_cache

    cache = tmp_path_factory.mktemp("hf-hub-cache")
    return cache, write_hub_cache(cache)


@pytest.fixture
def offline_hub(hub_cache, monkeypatch):
    """The hub cache as this process's Hugging Face cache, offline: hub ids load from it, nothing downloads."""
    cache, checkpoints = hub_cache
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return checkpoints
