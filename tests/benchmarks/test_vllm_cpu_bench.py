"""vllm_cpu_bench without vLLM: it says where to get it and exits cleanly; vLLM's environment is told how to run;
its repeats take turns and send prompts of their own."""

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


def test_repeats_take_turns_and_send_prompts_of_their_own(tmp_path):
    """Every other repeat reverses the servers' order; each repeat's prompts differ from the others' (no prefix
    cache holds them from the repeat before) and are the same whenever they are drawn (both servers get them)."""
    from benchmarks.common.checkpoints import save_random_gpt2
    from quill.models.loading.checkpoint import load_checkpoint

    from benchmarks.common.timing import in_turn

    assert [in_turn(vllm_cpu_bench.SERVERS, r) for r in range(3)] == [("vllm", "quill"), ("quill", "vllm"),
                                                                        ("vllm", "quill")]
    s = vllm_cpu_bench.SMOKE
    save_random_gpt2(tmp_path, s.gpt2, seed=s.seed)
    loaded = load_checkpoint(tmp_path, device="cpu", dtype="float32", name="m")
    loads = vllm_cpu_bench.repeat_loads(s, loaded, "m", 3)
    prompts = [[r.prompt for r in load] for load in loads]
    assert len(loads) == 3 and all(len(load) == s.num_requests for load in loads)
    assert prompts[0] != prompts[1] != prompts[2] != prompts[0]
    assert [[r.prompt for r in load] for load in vllm_cpu_bench.repeat_loads(s, loaded, "m", 3)] == prompts
