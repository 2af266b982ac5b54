"""The coverage-penalty restoration benchmark runs end to end on a bundled model (a few made-up lines in place of
the held-out plays, which need the corpus) and prints a row per setting."""

from __future__ import annotations

from benchmarks import coverage_restoration
from quill.models.training.restoration import Pair


class _Lines:
    def evaluation_pairs(self, lines: int) -> list[Pair]:
        pairs = [Pair("o farewell honest soldier", "O, farewell, honest soldier!"),
                 Pair("what say you my lord", "What say you, my lord?")]
        return pairs[:lines]


def test_a_row_per_setting(monkeypatch, capsys):
    monkeypatch.setattr(coverage_restoration, "prepare_restoration", lambda data_dir: _Lines())
    coverage_restoration.main(["--models", "shakespeare-restore-lstm", "--lines", "2", "--betas", "0.2",
                               "--beam", "2"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("shakespeare")]
    assert [row[1:3] if row[1] != "plain" else row[1:2] for row in rows] == [["plain"], ["wu", "0.2"],
                                                                             ["summary", "0.2"]]
    assert all(0.0 <= float(row[-3]) <= 100.0 for row in rows)  # BLEU
