"""vllm_cpu_bench without vLLM: it says where to get it and exits cleanly; vLLM's environment is told how to run."""

from pathlib import Path

from benchmarks import vllm_cpu_bench
from benchmarks.common.vllm_server import vllm_env, vllm_python


def test_without_a_vllm_environment_it_says_how_to_make_one(tmp_path, capsys):
    assert vllm_cpu_bench.main(["--vllm-venv", str(tmp_path / "none")]) is None
    out = capsys.readouterr().out
    assert f"no vLLM in {tmp_path / 'none'}" in out and "vllm_cpu_setup.sh" in out


def test_a_python_without_vllm_is_not_taken_for_one(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(Path(__import__("sys").executable))
    assert vllm_python(tmp_path) is None  # this environment has no vllm


def test_vllm_computes_on_the_threads_asked_for(tmp_path):
    one, two = vllm_env(tmp_path, 1, 4), vllm_env(tmp_path, 2, 4)
    assert one["VLLM_CPU_OMP_THREADS_BIND"] == "0" and two["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert one["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and two["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert not any(k.startswith("QUILL_") for k in one)
