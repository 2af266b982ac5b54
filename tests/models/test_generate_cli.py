"""`quill generate` loads a checkpoint and continues a prompt, offline."""

from __future__ import annotations

import subprocess
import sys

from quill.models.loading.checkpoint import save_checkpoint
from tests.conftest import build_tiny_model


def run_quill(*args):
    return subprocess.run([sys.executable, "-m", "quill.cli", *args], capture_output=True, text=True, timeout=120)


def test_generate_prints_prompt_and_continuation(tmp_path, tiny_tokenizer):
    for key in ("lstm", "gcnn", "transformer-llama"):
        arch, model = build_tiny_model(key, tiny_tokenizer.vocab_size)
        save_checkpoint(tmp_path / key, arch, model, tiny_tokenizer)
        result = run_quill("generate", "To be", "--model", str(tmp_path / key), "--max-tokens", "12", "--seed", "1", "--ignore-eos")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("To be") and len(result.stdout) > len("To be\n")


def test_greedy_generation_is_deterministic(tmp_path, tiny_tokenizer):
    arch, model = build_tiny_model("gcnn", tiny_tokenizer.vocab_size)
    save_checkpoint(tmp_path, arch, model, tiny_tokenizer)
    args = ("generate", "the mind", "--model", str(tmp_path), "--temperature", "0", "--max-tokens", "10")
    assert run_quill(*args).stdout == run_quill(*args).stdout


def test_bad_checkpoint_is_one_clear_line(tmp_path):
    result = run_quill("generate", "hi", "--model", str(tmp_path / "missing"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"quill generate: error: {tmp_path / 'missing'}: no such checkpoint directory"


def test_prompt_longer_than_the_context_is_refused(tmp_path, tiny_tokenizer):
    arch, model = build_tiny_model("transformer-gpt2", tiny_tokenizer.vocab_size)  # 64-token context
    save_checkpoint(tmp_path, arch, model, tiny_tokenizer)
    result = run_quill("generate", "the mind " * 20, "--model", str(tmp_path), "--max-tokens", "40")
    assert result.returncode == 2 and "exceeds the model's context of 64 tokens" in result.stderr
