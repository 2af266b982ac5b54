"""The prefix-key benchmark times every scheme at every block size and writes JSON."""

from __future__ import annotations

import json

from benchmarks import prefix_keys


def test_small_run_times_every_scheme_and_writes_json(tmp_path, capsys):
    out = tmp_path / "keys.json"
    result = prefix_keys.main(["--block-sizes", "4", "16", "--tokens", "64", "--runs", "1", "--out", str(out)])
    rows = result["rows"]
    assert [(r["block_size"], r["scheme"].split()[0]) for r in rows] == [
        (size, scheme) for size in (4, 16) for scheme in ("python", "SHA-256", "keyed")]
    assert all(r["key_ns"] > 0 and r["key_lookup_ns"] > 0 for r in rows)
    assert json.loads(out.read_text())["rows"] == rows and "SHA-256 chain (new)" in capsys.readouterr().out


def test_the_old_scheme_is_the_python_hash_chain():
    keys = prefix_keys.python_hash_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert keys == [(0, (1, 2, 3, 4)), (hash((0, (1, 2, 3, 4))), (5, 6, 7, 8))]
