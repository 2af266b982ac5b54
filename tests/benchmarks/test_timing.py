"""The benchmarks' shared timing helpers: contenders run in turn, every other repeat in reverse order."""

from __future__ import annotations

from benchmarks.common.timing import interleaved_runs


def test_interleaved_runs_reverse_the_order_every_other_repeat():
    calls, logged = [], []

    def contender(name):
        def run():
            calls.append(name)
            return {"n": len(calls)}
        return run

    results = interleaved_runs({name: contender(name) for name in "abc"}, 3, logged.append, lambda r: str(r["n"]))
    assert calls == list("abc" + "cba" + "abc")  # the first call of the process is not always a's
    assert [r["n"] for r in results["a"]] == [1, 6, 7] and [r["n"] for r in results["c"]] == [3, 4, 9]
    assert all("minor_page_faults" in r for rs in results.values() for r in rs) and len(logged) == 9
