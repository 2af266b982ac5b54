"""The CPU attention kernel's microbenchmark runs end to end on tiny shapes and checks a version against another."""

from __future__ import annotations

import pytest
import torch

from benchmarks import cpu_attention
from quill.models.attention.cpu_kernel import kernel
from tests.conftest import needs_cxx

pytestmark = needs_cxx


@pytest.fixture(scope="module")
def built():
    built = kernel()  # the suite builds it first (tests/conftest.py)
    assert not isinstance(built, str), f"the CPU attention kernel {built}"
    return built


def test_smoke_run_times_both_dtypes_in_and_out_of_cache(built, capsys):
    results = cpu_attention.main(["--smoke", "--threads", "1"])
    assert [(r["dtype"], r["setting"]) for r in results] == [
        (d, s) for d in ("float32", "bfloat16") for s in ("in cache", "out of cache")]
    assert all(r["ns_per_row"]["this"] > 0 for r in results)
    assert "ns/row" in capsys.readouterr().out


class _Wrong:
    """A 'kernel' whose answer is off: the comparison of versions must catch it."""

    def __init__(self, inner):
        self.inner = inner

    def paged_decode_attention(self, *args):
        return self.inner.paged_decode_attention(*args) + 0.1


def test_a_version_that_computes_other_attention_stops_the_run(built):
    with pytest.raises(AssertionError):
        cpu_attention.measure({"this": built, "other": _Wrong(built)}, torch.float32, 1, None, 1, seqs=2)
