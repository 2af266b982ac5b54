"""benchmarks/seq2seq_engine_profile on the tiny Marian: both batches run, the timed one on sources of its own."""

from __future__ import annotations

import pytest

from benchmarks import seq2seq_engine_profile

pytest.importorskip("sentencepiece")


@pytest.mark.parametrize("beams", [1, 3])
def test_the_profile_times_every_step_of_fresh_sources(tmp_path, capsys, beams):
    seq2seq_engine_profile.main(["--requests", "5", "--new-tokens", "4", "--beams", str(beams), "--top", "3",
                                 "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert f"5 requests, beams {beams}, 4 new tokens each" in out
    steps = int(out.split(" steps in ")[0].rsplit("\n", 1)[-1])
    assert steps >= 4 and "tokens/s" in out and "function calls" in out
