"""Overlapped scheduling (EngineConfig.async_scheduling) gives exactly the synchronous engine's answers.

Each scenario runs twice, with the flag off and on, feeding the same requests and aborts before the
same step calls; the outputs must be identical and the overlapped run must really have overlapped.
The scripted model's next token is looked up from the input token, so a wrong input token spliced
from the previous step's sampled ids changes every answer after it.
"""

from __future__ import annotations

import pytest
import torch

from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.server.engine.helpers import collect, scripted_engine
from tests.server.engine.test_engine import loaded_model

GREEDY = dict(temperature=0.0)
SEEDED = dict(temperature=0.9, top_p=0.95, seed=7)


def drive(engine: EngineCore, arrivals: dict[int, list], aborts: dict[int, list[str]] | None = None,
          max_steps: int = 2000) -> tuple[dict, dict[str, int]]:
    """Step until done, adding `arrivals[i]` ((id, prompt, params) each) and aborting `aborts[i]` before
    step call i. Returns the collected results and, per request, the step call of its last output."""
    aborts = aborts or {}
    results, last_output, groups = {}, {}, {}
    for i in range(max_steps):
        for request_id, prompt, params in arrivals.get(i, []):
            engine.add_request(request_id, prompt, params)
            groups[request_id] = engine.groups[request_id]
        for request_id in aborts.get(i, []):
            engine.abort(request_id)
        if not engine.has_work() and i > max(arrivals, default=0):
            assert_no_token_beyond_the_emitted(groups, results)
            return results, last_output
        outputs = engine.step()
        collect(results, outputs)
        for out in outputs:
            last_output[out.request_id] = i
    raise AssertionError("the engine did not finish")


def assert_no_token_beyond_the_emitted(groups: dict, results: dict) -> None:
    """A token computed after its sequence finished or its request was aborted is dropped, not appended."""
    for request_id, group in groups.items():
        if group.params.use_beam_search:
            continue
        for seq in group.finished_seqs + group.seqs:
            emitted = results.get(request_id, {}).get(seq.index, {}).get("token_ids", [])
            assert seq.output_token_ids == emitted


def assert_drained(engine: EngineCore) -> None:
    assert engine._in_flight is None and not engine.groups
    assert engine.cache.usage == 0.0


def assert_same_answers(overlapped: dict, sync: dict, arrivals: dict[int, list]) -> None:
    """Every output identical, cumulative log-probabilities included (0.0 where a request does not score its samples,
    whatever shared its steps), except the sums and beam scores a real model's scores make up: a row's logits
    depend in their last bits on what else its step computed (MKL's kernel for fewer than 4 rows, attention padded
    to the step's longest sequence), and the two runs batch differently, so those agree to float rounding.
    test_scored_sums_match_sync_exactly shows that the engine adds the same scores up bit-identically."""
    params = {request_id: p for batch in arrivals.values() for request_id, _, p in batch}
    assert overlapped.keys() == sync.keys()
    for request_id, outputs in sync.items():
        assert overlapped[request_id].keys() == outputs.keys(), request_id
        model_sums = params[request_id].scores_samples or params[request_id].use_beam_search
        for i, want in outputs.items():
            have = overlapped[request_id][i]
            if model_sums:
                for key in ("cumulative_logprob", "score"):  # a sample's score is None
                    close = None if want[key] is None else pytest.approx(want[key], rel=1e-5, abs=1e-5)
                    assert have[key] == close, (request_id, i, key)
                have, want = ({k: v for k, v in out.items() if k not in ("cumulative_logprob", "score")}
                              for out in (have, want))
            else:
                assert want["cumulative_logprob"] == 0.0, (request_id, i)
            assert have == want, (request_id, i)


def both(make, arrivals, aborts=None):
    sync_engine, overlapped_engine = make(False), make(True)
    sync, _ = drive(sync_engine, arrivals, aborts)
    overlapped, _ = drive(overlapped_engine, arrivals, aborts)
    assert_drained(sync_engine)
    assert_drained(overlapped_engine)
    assert sync_engine.num_overlapped_steps == 0
    return sync, overlapped, overlapped_engine


def mixed_arrivals(vocab: int) -> dict[int, list]:
    """Greedy and seeded requests, max_tokens and stop strings, some arriving while others decode."""
    return {
        0: [("greedy", [5, 6, 7], SamplingParams(max_tokens=12, **GREEDY)),
            ("seeded", [9, 10], SamplingParams(max_tokens=15, **SEEDED)),
            ("long", list(range(20, 40)), SamplingParams(max_tokens=30, **GREEDY))],
        4: [("late", [11, 12, 13], SamplingParams(max_tokens=9, **SEEDED))],
        9: [("stop", [30, 31], SamplingParams(max_tokens=25, stop=["a", "e"], **SEEDED)),
            ("short", [3], SamplingParams(max_tokens=1, **GREEDY))],
        15: [("eos", [14, 15], SamplingParams(max_tokens=40, temperature=1.5, seed=1))],
    }


@pytest.mark.parametrize("state_kind", ["paged_kv", "slots", "hybrid"])
def test_scripted_mix_matches_sync_and_overlaps(tiny_tokenizer, state_kind):
    def make(on):
        return scripted_engine(tiny_tokenizer, state_kind=state_kind, async_scheduling=on)

    sync, overlapped, engine = both(make, mixed_arrivals(tiny_tokenizer.vocab_size))
    assert overlapped == sync
    assert {r[0]["finish_reason"] for r in sync.values()} >= {"length", "stop"}
    assert engine.num_overlapped_steps > 20
    # Most overlapped steps decode the same sequences as the step before, on its inputs moved one position on.
    assert 10 < engine.runner.num_reused_steps < engine.num_overlapped_steps


def test_eos_stop_matches_sync(tiny_tokenizer):
    """A model that ends every sequence with EOS after a position that differs per prompt."""
    vocab = tiny_tokenizer.vocab_size

    def eos_after(tokens, positions):
        logits = torch.full((len(tokens), vocab), -20.0, device=tokens.device)
        nxt = torch.where(positions >= 6 + tokens % 5, torch.zeros_like(tokens), (tokens * 7 + 3) % (vocab - 1) + 1)
        logits[torch.arange(len(tokens), device=tokens.device), nxt] = 0.0
        return logits

    def make(on):
        return scripted_engine(tiny_tokenizer, logits_fn=eos_after, async_scheduling=on)

    arrivals = {0: [(f"r{i}", [i + 1, i + 2], SamplingParams(max_tokens=30, **GREEDY)) for i in range(6)],
                3: [("late", [50], SamplingParams(max_tokens=30, **GREEDY))]}
    sync, overlapped, engine = both(make, arrivals)
    assert overlapped == sync
    assert all(r[0]["finish_reason"] == "stop" for r in sync.values())
    assert engine.num_overlapped_steps > 0


def scored_arrivals() -> dict[int, list]:
    """Requests that score their samples (n > 1, logprobs) beside ones that do not, joining and leaving mid-run."""
    return {
        0: [("greedy", [5, 6, 7], SamplingParams(max_tokens=22, ignore_eos=True, **GREEDY)),
            ("seeded", [9, 10], SamplingParams(max_tokens=26, ignore_eos=True, **SEEDED))],
        3: [("n2", [11, 12], SamplingParams(n=2, max_tokens=6, ignore_eos=True, **SEEDED))],
        8: [("logprobs", [13], SamplingParams(max_tokens=7, logprobs=2, ignore_eos=True, **GREEDY))],
        12: [("late", [14, 15], SamplingParams(max_tokens=6, ignore_eos=True, **SEEDED)),
             ("n3", [16], SamplingParams(n=3, max_tokens=5, logprobs=0, ignore_eos=True, temperature=1.2, seed=3))],
    }


@pytest.mark.parametrize("state_kind", ["paged_kv", "slots", "hybrid"])
def test_scored_sums_match_sync_exactly(tiny_tokenizer, state_kind):
    """cumulative_logprob is bit-identical: a request that scores its samples adds the same scores in the same order
    in both runs (the scripted model's scores do not depend on the batch), and one that does not reports 0.0,
    though the sampler scores every row of a step where some row asks, and the two runs batch differently."""
    def make(on):
        return scripted_engine(tiny_tokenizer, state_kind=state_kind, async_scheduling=on)

    arrivals = scored_arrivals()
    sync, overlapped, engine = both(make, arrivals)
    assert overlapped == sync
    params = {request_id: p for batch in arrivals.values() for request_id, _, p in batch}
    for request_id, outputs in sync.items():
        for out in outputs.values():
            assert (out["cumulative_logprob"] < 0) == params[request_id].scores_samples, request_id
    for out in list(sync["logprobs"].values()) + list(sync["n3"].values()):
        total = 0.0
        for entry in out["logprobs"]:  # the engine's order of addition
            total += entry.logprob
        assert out["cumulative_logprob"] == total
    assert engine.num_overlapped_steps > 10


@pytest.mark.parametrize("state_kind", ["paged_kv", "slots", "hybrid"])
def test_aborts_mid_run_emit_nothing_after_the_abort(tiny_tokenizer, state_kind):
    def make(on):
        return scripted_engine(tiny_tokenizer, state_kind=state_kind, async_scheduling=on)

    params = SamplingParams(max_tokens=40, ignore_eos=True, **SEEDED)
    arrivals = {0: [(f"r{i}", [i + 3, i + 4], params) for i in range(5)]}
    aborts = {6: ["r1"], 7: ["r3", "r4"], 12: ["r0"]}
    for on in (False, True):
        engine = make(on)
        results, last_output = drive(engine, arrivals, aborts)
        assert_drained(engine)
        full, _ = drive(make(False), arrivals)
        for step, ids in aborts.items():
            for request_id in ids:
                assert last_output[request_id] < step  # nothing emitted by the abort's step call or later
                emitted = results[request_id][0]["token_ids"]
                assert emitted == full[request_id][0]["token_ids"][: len(emitted)]
        assert results["r2"] == full["r2"]
    assert engine.num_overlapped_steps > 0


@pytest.mark.parametrize("state_kind", ["paged_kv", "slots", "hybrid"])
def test_preemption_under_a_small_cache_matches_sync(tiny_tokenizer, state_kind):
    def make(on):
        return scripted_engine(tiny_tokenizer, state_kind=state_kind, max_num_seqs=4, num_blocks=14,
                               async_scheduling=on)

    arrivals = {0: [(f"r{i}", [i + 2, i + 3, i + 4], SamplingParams(max_tokens=14, ignore_eos=True, **SEEDED))
                    for i in range(4)],
                5: [("late", [40, 41], SamplingParams(max_tokens=10, ignore_eos=True, **GREEDY))]}
    sync, overlapped, engine = both(make, arrivals)
    assert overlapped == sync
    assert engine.num_overlapped_steps > 0
    if state_kind == "paged_kv":  # 4 sequences of 17 tokens need 20 blocks of 4
        assert engine.scheduler.num_preemptions > 0


def test_steps_that_need_the_host_never_overlap(tiny_tokenizer):
    """Beam search, penalties and min_tokens read host state every step: they run synchronously."""
    def make(on):
        return scripted_engine(tiny_tokenizer, async_scheduling=on)

    arrivals = {0: [("beam", [5, 6], SamplingParams(max_tokens=8, use_beam_search=True, beam_width=3,
                                                     temperature=0.0)),
                    ("penalty", [7, 8], SamplingParams(max_tokens=10, repetition_penalty=1.3, **SEEDED)),
                    ("min", [9], SamplingParams(max_tokens=10, min_tokens=8, **GREEDY))]}
    sync, overlapped, engine = both(make, arrivals)
    assert overlapped == sync
    assert engine.num_overlapped_steps == 0


ARCHS = ["lstm", "gcnn", "transformer-llama", "transformer-gpt2"]


@pytest.mark.parametrize("arch", ARCHS)
def test_real_models_with_beams_and_samples_match_sync(tiny_tokenizer, arch):
    """Tiny real models: plain requests overlap, and beam search or n > 1 joining mid-run falls back and back."""
    loaded = loaded_model(arch, tiny_tokenizer)

    def make(on):
        return EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=48),
                                               CacheConfig(block_size=4, num_blocks=256), async_scheduling=on))

    arrivals = {
        0: [("greedy", [3, 4, 5, 6, 7, 8], SamplingParams(max_tokens=16, **GREEDY)),
            ("seeded", [50, 51], SamplingParams(max_tokens=20, ignore_eos=True, **SEEDED))],
        5: [("n2", [20, 21, 22], SamplingParams(n=2, max_tokens=8, ignore_eos=True, **SEEDED))],
        12: [("beam", [60, 61], SamplingParams(max_tokens=5, use_beam_search=True, beam_width=2, n=2,
                                               temperature=0.0, ignore_eos=True)),
             ("stop", [70], SamplingParams(max_tokens=12, stop=["e"], **SEEDED))],
    }
    sync, overlapped, engine = both(make, arrivals)
    assert_same_answers(overlapped, sync, arrivals)
    assert len(sync["n2"]) == 2 and len(sync["beam"]) == 2
    assert engine.num_overlapped_steps > 5 and engine.runner.num_reused_steps > 0  # block boundaries (size 4) crossed


@pytest.mark.parametrize("arch", ["lstm", "transformer-llama"])
def test_overlapped_steps_replay_graphs_with_the_eager_answers(tiny_tokenizer, arch):
    """Decode steps replayed as (emulated, on the CPU) graphs take their input tokens from the device too."""
    from tests.server.engine.test_graphs import make_engine, record_replays, run_arrivals

    # Batches shrink and grow (1 to 7 sequences) so that several buckets replay, with padding rows.
    arrivals = [(step, f"r{i}", [3 + i, 4 + i, 5 + i], SamplingParams(max_tokens=4 + 3 * i, ignore_eos=True,
                                                                     **(GREEDY if i % 2 else SEEDED)))
                for i, step in enumerate([0, 0, 1, 6, 6, 6, 7])]
    loaded = loaded_model(arch, tiny_tokenizer)
    expected = run_arrivals(make_engine(loaded, graphs=False), arrivals)
    engine = make_engine(loaded, graphs=True, async_scheduling=True)
    replays = record_replays(engine)
    got = run_arrivals(engine, arrivals)
    assert got.keys() == expected.keys()
    for request_id, outputs in expected.items():
        for index, want in outputs.items():
            have = got[request_id][index]
            assert (have["token_ids"], have["text"], have["finish_reason"]) == \
                (want["token_ids"], want["text"], want["finish_reason"]), (request_id, index)
    assert engine.num_overlapped_steps > 10 and len(replays) > engine.num_overlapped_steps
    assert 5 < engine.runner.num_reused_steps < engine.num_overlapped_steps
    assert any(real < size for real, size in replays) and len({size for _, size in replays}) >= 3, replays
    assert_drained(engine)


def test_a_fault_with_a_step_in_flight_fails_its_requests_and_the_engine_goes_on(tiny_tokenizer, monkeypatch):
    from quill.server.engine.process.core_loop import CoreLoop

    engine = scripted_engine(tiny_tokenizer, async_scheduling=True)
    loop = CoreLoop(engine)
    for request_id in ("a", "b"):
        assert loop.add(request_id, [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True, **GREEDY)) is None
    while engine.num_overlapped_steps < 3:
        loop.step()
    assert engine._in_flight is not None

    def fault(host):  # as a device fault surfaces: when the step's results are waited for
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    real_launch = engine.runner.launch

    def faulty_launch(*args, **kwargs):
        pending = real_launch(*args, **kwargs)
        pending.build = fault
        return pending

    monkeypatch.setattr(engine.runner, "launch", faulty_launch)
    loop.step()  # commits the step launched before the fault, launches a faulty one
    failed = dict(loop.step())
    assert set(failed) == {"a", "b"} and all(out.error.startswith("out of GPU memory") for out in failed.values())
    assert not engine.has_work() and engine._in_flight is None
    monkeypatch.setattr(engine.runner, "launch", real_launch)
    loop.add("c", [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True, **GREEDY))
    results = {}
    while engine.has_work():
        collect(results, [out for _, out in loop.step()])
    assert len(results["c"][0]["token_ids"]) == 5
    assert_drained(engine)


@pytest.mark.parametrize("arch", ["lstm", "gcnn"])
def test_a_sequence_ending_with_a_step_in_flight_leaves_its_whole_state_for_the_next_turn(tiny_tokenizer, arch):
    """The step in flight computes the finished sequence's last token too; the snapshot taken after it holds every
    token, so the next turn resumes from one token further than a synchronous engine's, with the same answers."""
    loaded = loaded_model(arch, tiny_tokenizer)

    def turns(on: bool) -> tuple[list[int], int, EngineCore]:
        engine = EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs=4), CacheConfig(block_size=4,
                            num_blocks=64), async_scheduling=on))
        prompt = [3, 4, 5, 6, 7]
        first, _ = drive(engine, {0: [("first", prompt, SamplingParams(max_tokens=6, ignore_eos=True, **GREEDY))]})
        assert engine.num_overlapped_steps > 0 if on else engine.num_overlapped_steps == 0
        history = prompt + first["first"][0]["token_ids"]
        hits = engine.cache.prefix_hits
        params = SamplingParams(max_tokens=6, ignore_eos=True, **GREEDY)
        second, _ = drive(engine, {0: [("second", history + [8, 9], params)]})
        return second["second"][0]["token_ids"], engine.cache.prefix_hits - hits, len(history)

    sync_tokens, sync_hits, length = turns(False)
    overlapped_tokens, overlapped_hits, _ = turns(True)
    assert overlapped_tokens == sync_tokens
    assert (sync_hits, overlapped_hits) == (length - 1, length)
