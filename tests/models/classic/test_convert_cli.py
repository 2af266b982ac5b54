"""`quill convert` writes a classic checkpoint as a Quill one; `quill generate` reads the original directly."""

from __future__ import annotations

import torch

from quill.models.loading.checkpoint import load_checkpoint
from quill.cli import main
from tests.models.classic.wlm_checkpoints import build_rnn_model, reference_logits, save_whole, write_corpus
from tests.models.test_generate_cli import run_quill

PROMPT = [1, 2, 3, 0, 4, 1, 5]


def test_convert_writes_a_checkpoint_that_loads_with_the_same_logits(tmp_path, capsys):
    reference = build_rnn_model(tmp_path / "code", "LSTM", tied=True)
    data = write_corpus(tmp_path / "data")
    save_whole(reference, tmp_path / "model.pt")
    assert main(["convert", str(tmp_path / "model.pt"), "--vocab", str(data), "--out", str(tmp_path / "quill")]) == 0
    assert "(word_language_model)" in capsys.readouterr().out
    loaded = load_checkpoint(tmp_path / "quill", device="cpu", dtype="float32")
    assert sorted(p.name for p in (tmp_path / "quill").iterdir()) == ["config.json", "model.safetensors",
                                                                     "tokenizer.json"]
    assert loaded.metadata["source_format"] == "word_language_model" and loaded.eos_token_ids == []
    torch.testing.assert_close(loaded.model(torch.tensor([PROMPT]))[0], reference_logits(reference, PROMPT),
                               atol=1e-5, rtol=0)


def test_convert_refuses_what_it_cannot_read(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert main(["convert", str(tmp_path / "notes.txt"), "--out", str(tmp_path / "out")]) == 2
    assert "not a checkpoint of a known format" in capsys.readouterr().err


def test_generate_reads_the_original_directory(tmp_path):
    save_whole(build_rnn_model(tmp_path / "code", "GRU"), write_corpus(tmp_path / "run") / "model.pt")
    result = run_quill("generate", "the cat", "--model", str(tmp_path / "run"), "--max-tokens", "12",
                       "--temperature", "0", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("the cat") and len(result.stdout.split()) > 4


def test_a_file_of_no_known_format_is_one_clear_line(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\x00" * 16)
    result = run_quill("generate", "hi", "--model", str(tmp_path / "weights.bin"))
    assert result.returncode == 2
    assert "not a checkpoint directory nor a classic toolkit's checkpoint" in result.stderr


def test_convert_finds_a_fairseq_fconv_directory_by_itself(tmp_path, capsys):
    """The registry tries every format: no import or flag names fconv here."""
    from tests.models.classic.fairseq_fconv_reference import write_checkpoint

    reference = write_checkpoint(tmp_path / "fconv")
    assert main(["convert", str(tmp_path / "fconv"), "--out", str(tmp_path / "quill")]) == 0
    assert "(fconv_lm)" in capsys.readouterr().out
    loaded = load_checkpoint(tmp_path / "quill", device="cpu", dtype="float32")
    prompt = [2, 5, 9, 30, 50]
    torch.testing.assert_close(loaded.model(torch.tensor([prompt]))[0].log_softmax(-1), reference.log_probs(prompt),
                               atol=1e-5, rtol=0)
