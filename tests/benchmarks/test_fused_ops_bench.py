"""The fused-ops microbenchmark runs end to end on tiny shapes (on the CPU through the Triton interpreter)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="needs the triton package (the test extra installs it on Linux x86-64)")

from benchmarks import fused_ops_bench  # noqa: E402
from tests.conftest import KERNEL_DEVICE  # noqa: E402


def test_smoke_run_times_every_op_at_every_batch_and_writes_json(tmp_path, capsys):
    out = tmp_path / "fused.json"
    result = fused_ops_bench.main(["--smoke", "--device", str(KERNEL_DEVICE), "--out", str(out)])
    timings = result["timings"]
    assert [(t["op"], t["batch"]) for t in timings] == [
        (op, batch) for batch in (1, 3) for op in ("rms_norm", "add_rms_norm", "rope", "swiglu")]
    assert all(t["torch_us"] > 0 and t["fused_us"] > 0 and t["max_abs_diff"] < 1e-3 for t in timings)
    graphs_timed = KERNEL_DEVICE.type == "cuda"
    assert all((t["fused_graph_us"] is not None) == graphs_timed for t in timings)
    step = result["per_step_us"][1]["torch_us"]
    by_op = {t["op"]: t["torch_us"] for t in timings if t["batch"] == 1}
    assert step == pytest.approx(2 * (sum(by_op.values())) + by_op["rms_norm"])  # SMOKE has 2 layers
    assert out.read_text().startswith("{") and "per step" in capsys.readouterr().out


def test_a_fused_op_that_disagrees_with_torch_stops_the_run(monkeypatch):
    from quill.models.kernels.triton_ops import TritonLayerOps

    monkeypatch.setattr(TritonLayerOps, "gated_act", lambda self, h, activation: h[..., : h.shape[-1] // 2])
    with pytest.raises(AssertionError, match="swiglu at batch 1: fused differs"):
        fused_ops_bench.main(["--smoke", "--device", str(KERNEL_DEVICE)])
