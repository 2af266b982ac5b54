"""A failed step fails its requests, and leaves the prefix caches holding only what finished steps wrote:
a later prompt with the same prefix gets the answer a fresh engine gives."""

from __future__ import annotations

import pytest
import torch

from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.process.core_loop import CoreLoop
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.server.engine.helpers import collect
from tests.server.engine.test_engine import loaded_model

BLOCK = 4
PROMPT = list(range(100, 114))  # three full blocks (or state snapshot intervals) and two tokens
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)


def make_loop(loaded, async_scheduling: bool = False) -> CoreLoop:
    # A budget of one block: a prompt is computed one block per step.
    return CoreLoop(EngineCore(loaded, EngineConfig(
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=BLOCK),
        CacheConfig(block_size=BLOCK, num_blocks=64), async_scheduling=async_scheduling,
    )))


def serve(loop: CoreLoop, request_id: str, prompt: list[int], params: SamplingParams = GREEDY) -> dict:
    assert loop.add(request_id, prompt, params) is None
    results: dict = {}
    while loop.core.has_work():
        collect(results, [out for _, out in loop.step()])
    return results[request_id][0]


def assert_as_fresh(loaded, loop: CoreLoop, prompt: list[int]) -> None:
    """`loop` answers `prompt` as an engine that never served anything does, to float rounding."""
    got, want = serve(loop, "later", prompt), serve(make_loop(loaded), "fresh", prompt)
    assert got["token_ids"] == want["token_ids"]
    assert [e.logprob for e in got["logprobs"]] == pytest.approx([e.logprob for e in want["logprobs"]], abs=1e-5)


def fail_on_call(monkeypatch, obj, name: str, call: int) -> None:
    """The `call`-th call of obj.name raises before doing anything, as a fault in it would."""
    real, calls = getattr(obj, name), []

    def faulty(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise RuntimeError("injected fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, faulty)


def fail_first_request(loop: CoreLoop) -> None:
    assert loop.add("failed", PROMPT, GREEDY) is None
    failed = []
    while loop.core.has_work():
        failed += loop.step()
    assert [(request_id, out.error) for request_id, out in failed] == [("failed", "internal error while "
                                                                         "generating: RuntimeError: injected fault")]


@pytest.mark.parametrize("fault", ["next step's run", "output processing"])
@pytest.mark.parametrize("arch", ["lstm", "gcnn"])
def test_a_snapshot_whose_copy_a_failed_step_never_made_is_not_reused(tiny_tokenizer, monkeypatch, arch, fault):
    """Step 1 computes the first 4 prompt tokens, and its commit keys a snapshot whose copy the next step
    would make. Here the next step fails before its device work, or step 1 itself fails after its commit."""
    loaded = loaded_model(arch, tiny_tokenizer)
    loop = make_loop(loaded)
    if fault == "next step's run":
        fail_on_call(monkeypatch, loop.core.runner, "run", 2)
    else:
        fail_on_call(monkeypatch, loop.core, "_update", 1)
    fail_first_request(loop)
    assert_as_fresh(loaded, loop, PROMPT[:BLOCK] + [7])
    assert loop.core.cache.prefix_hits == 0  # there is no snapshot of those tokens to start from


@pytest.mark.parametrize("arch", ["lstm", "transformer-llama"])
def test_what_finished_steps_wrote_stays_cached_past_a_fault(tiny_tokenizer, monkeypatch, arch):
    """Steps 1 and 2 compute 8 prompt tokens and finish; step 3 fails."""
    loaded = loaded_model(arch, tiny_tokenizer)
    loop = make_loop(loaded)
    fail_on_call(monkeypatch, loop.core.runner, "run", 3)
    fail_first_request(loop)
    assert_as_fresh(loaded, loop, PROMPT[: 2 * BLOCK] + [7])
    # K,V: both blocks. State: the snapshot after 4 tokens (the one after 8 would be copied by step 3).
    assert loop.core.cache.prefix_hits == (2 * BLOCK if arch.startswith("transformer") else BLOCK)


def test_kv_blocks_keyed_by_an_overlapped_step_that_failed_are_not_reused(tiny_tokenizer, monkeypatch):
    """With async scheduling a decode step is committed, and its full blocks keyed, before its results are
    read. The step faults when they are; its K,V writes cannot be trusted (here: they are garbage)."""
    loaded = loaded_model("transformer-llama", tiny_tokenizer)
    loop = make_loop(loaded, async_scheduling=True)
    core = loop.core
    assert loop.add("failed", PROMPT, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)) is None
    seq = core.groups["failed"].seqs[0]
    real_launch = core.runner.launch
    faulty_block = []

    def launch(batch, inputs_from=None):
        pending = real_launch(batch, inputs_from)
        position = seq.num_computed  # of the token this step computes
        if inputs_from is not None and position >= 24 and (position + 1) % BLOCK == 0 and not faulty_block:
            block = core.cache.block_table(seq.seq_id)[position // BLOCK]  # full once this step is committed
            core.state.k[:, block].normal_()
            core.state.v[:, block].normal_()
            faulty_block.append(position + 1)

            def fault(host):
                raise RuntimeError("injected fault")

            pending.build = fault
        return pending

    monkeypatch.setattr(core.runner, "launch", launch)
    failed = []
    while core.has_work():
        failed += loop.step()
    assert [request_id for request_id, out in failed if out.error] == ["failed"] and faulty_block
    assert core.num_overlapped_steps > 10
    end = faulty_block[0]  # the faulty block's keyed tokens end here
    hits_before = core.cache.prefix_hits
    assert_as_fresh(loaded, loop, seq.token_ids[:end] + [7])
    assert core.cache.prefix_hits - hits_before == end - BLOCK  # every block but the faulty one
