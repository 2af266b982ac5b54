"""A converted fconv_lm through the engine: greedy, beams, logprobs and batching give fairseq's answers."""

from __future__ import annotations

import pytest
import torch

from quill.models.loading.checkpoint import LoadedModel
from quill.models.classic.conversion import convert
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.models.classic.fairseq_fconv_reference import write_checkpoint
from tests.server.engine.helpers import run_to_completion

pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm. is deprecated:FutureWarning")

EOS = 2
PROMPTS = [[2, 5, 9, 30, 50, 70, 4, 4, 12, 41, 39, 20], [2, 5, 9, 30, 50, 61], [2], [2, 44, 43, 42, 41, 40, 39, 38]]


def converted_pair(directory, adaptive: bool):
    reference = write_checkpoint(directory, adaptive=adaptive)
    converted = convert(directory)
    loaded = LoadedModel("fconv", None, "fconv", converted.model, converted.tokenizer, [EOS], torch.device("cpu"),
                         torch.float32)
    return reference, loaded


@pytest.fixture(scope="module", params=[True, False], ids=["adaptive", "fc3"])
def pair(request, tmp_path_factory):
    return converted_pair(tmp_path_factory.mktemp("fconv"), request.param)


@pytest.fixture(scope="module")
def adaptive_pair(tmp_path_factory):
    """Only an adaptive softmax has a cheaper exact argmax (an fc3 head never claims one: see below)."""
    return converted_pair(tmp_path_factory.mktemp("fconv-adaptive"), True)


def engine(loaded, budget=16, async_scheduling=False) -> EngineCore:
    return EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget),
                                           CacheConfig(block_size=4, num_blocks=256),
                                           async_scheduling=async_scheduling))


def reference_greedy(reference, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(reference.log_probs(ids)[-1].argmax()))
    return ids[len(prompt):]


def reference_beams(reference, prompt, width, n):
    """Beam search where no beam ends early (EOS ignored): the `width` best by summed log-probability."""
    beams = [(0.0, [])]
    for _ in range(n):
        candidates = []
        for score, ids in beams:
            log_probs = reference.log_probs(prompt + ids)[-1].double()
            top = log_probs.topk(width)
            candidates += [(score + v.item(), ids + [i.item()]) for v, i in zip(top.values, top.indices)]
        beams = sorted(candidates, key=lambda c: -c[0])[:width]
    return beams


@pytest.mark.parametrize("busy", [False, True])
def test_greedy_equals_the_reference_alone_and_in_a_busy_batch(pair, busy):
    reference, loaded = pair
    e = engine(loaded)
    if busy:
        for i in range(6):
            e.add_request(f"noise{i}", PROMPTS[i % 4][: 2 + i], SamplingParams(max_tokens=5 + i, seed=i, n=1 + i % 2))
    for i, prompt in enumerate(PROMPTS):
        e.add_request(f"g{i}", prompt, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    results = run_to_completion(e)
    for i, prompt in enumerate(PROMPTS):
        assert results[f"g{i}"][0]["token_ids"] == reference_greedy(reference, prompt, 10), f"prompt {i}"
    assert e.cache.usage == 0


def test_beams_equal_the_reference(pair):
    reference, loaded = pair
    e = engine(loaded)
    for i, prompt in enumerate(PROMPTS[:2]):
        e.add_request(f"beam{i}", prompt, SamplingParams(max_tokens=5, use_beam_search=True, beam_width=3, n=3,
                                                         ignore_eos=True))
    results = run_to_completion(e)
    for i, prompt in enumerate(PROMPTS[:2]):
        want = reference_beams(reference, prompt, 3, 5)
        got = results[f"beam{i}"]
        assert [got[j]["token_ids"] for j in range(3)] == [ids for _, ids in want]
        assert [got[j]["score"] for j in range(3)] == pytest.approx([s / 5 for s, _ in want], abs=1e-4)


def test_logprobs_of_prompt_and_output_are_the_references(pair):
    reference, loaded = pair
    prompt = PROMPTS[0]
    e = engine(loaded, budget=5)  # the prompt in several chunks
    e.add_request("scored", prompt, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=3,
                                                   prompt_logprobs=2))
    result = run_to_completion(e)["scored"]
    full = reference.log_probs(prompt + result[0]["token_ids"])
    scored = result["prompt_logprobs"]
    for t in range(1, len(prompt)):
        assert scored[t].logprob == pytest.approx(full[t - 1, prompt[t]].item(), abs=1e-5)
        assert [i for i, _ in scored[t].top] == full[t - 1].topk(2).indices.tolist()
    for k, lp in enumerate(result[0]["logprobs"]):
        row = full[len(prompt) - 1 + k]
        assert lp.logprob == pytest.approx(row.max().item(), abs=1e-5)
        assert [i for i, _ in lp.top] == row.topk(3).indices.tolist()


def test_seeded_sampling_is_the_same_alone_and_batched(pair):
    _, loaded = pair
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7, n=2, ignore_eos=True)
    e = engine(loaded)
    e.add_request("alone", PROMPTS[1], params)
    alone = run_to_completion(e)["alone"]
    for i, prompt in enumerate(PROMPTS):
        e.add_request(f"other{i}", prompt, SamplingParams(max_tokens=9, seed=i, ignore_eos=True))
    e.add_request("batched", PROMPTS[1], params)
    batched = run_to_completion(e)["batched"]
    assert [alone[j]["token_ids"] for j in range(2)] == [batched[j]["token_ids"] for j in range(2)]


def test_prefix_cache_snapshots_continue_exactly(pair):
    reference, loaded = pair
    e = engine(loaded)
    shared = [2] + list(range(10, 31))  # many blocks of 4
    e.add_request("first", shared + [5], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    run_to_completion(e)
    hits = e.cache.prefix_hits
    e.add_request("second", shared + [6, 7], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    second = run_to_completion(e)["second"][0]["token_ids"]
    assert e.cache.prefix_hits > hits
    assert second == reference_greedy(reference, shared + [6, 7], 6)


def test_decode_steps_replayed_as_graphs_give_the_eager_answers(pair):
    """The runner's graph path: CUDA's own on a GPU, emulated on a CPU (capture refuses what a CUDA stream could not
    capture)."""
    from tests.server.engine.test_graphs import (ARRIVALS, assert_same_answers, make_engine, on_test_device,
                                                 record_replays, run_arrivals)

    loaded = on_test_device(pair[1])
    arrivals = [(step, rid, [t % loaded.tokenizer.vocab_size for t in prompt], params)
                for step, rid, prompt, params in ARRIVALS]
    expected = run_arrivals(make_engine(loaded, graphs=False), arrivals)
    engine = make_engine(loaded, graphs=True)
    replays = record_replays(engine)
    assert_same_answers(run_arrivals(engine, arrivals), expected)
    assert {1, 2, 4, 8} <= {size for _, size in replays}


MIXED = [
    ("greedy", SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)),
    ("sampled", SamplingParams(max_tokens=8, temperature=0.8, top_k=50, seed=3, ignore_eos=True)),
    ("logprobs", SamplingParams(max_tokens=8, temperature=0, logprobs=2, ignore_eos=True)),
    ("prompt-scored", SamplingParams(max_tokens=4, temperature=0.5, seed=5, prompt_logprobs=1, ignore_eos=True)),
    ("penalised", SamplingParams(max_tokens=6, temperature=0, repetition_penalty=1.3, ignore_eos=True)),
    ("min-tokens", SamplingParams(max_tokens=6, temperature=0, min_tokens=3)),
    ("greedy-n2", SamplingParams(max_tokens=5, temperature=0, n=2, ignore_eos=True)),
]


def count_scoring(monkeypatch, softmax) -> dict[str, list[int]]:
    """Rows given to the adaptive softmax's `greedy` and `log_probs`, call by call, from here on."""
    calls = {"greedy": [], "log_probs": []}
    for name in calls:
        original = getattr(softmax, name)

        def counted(h, original=original, name=name):
            calls[name].append(h.shape[0])
            return original(h)

        monkeypatch.setattr(softmax, name, counted)
    return calls


def run_requests(loaded, requests) -> dict:
    e = engine(loaded)
    for i, (rid, params) in enumerate(requests):
        e.add_request(rid, PROMPTS[i % len(PROMPTS)], params)
    return run_to_completion(e)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlapped"])
def test_greedy_requests_score_only_their_argmax(adaptive_pair, monkeypatch, overlap):
    reference, loaded = adaptive_pair
    calls = count_scoring(monkeypatch, loaded.model.adaptive_softmax)
    e = engine(loaded, async_scheduling=overlap)
    for i, prompt in enumerate(PROMPTS):
        e.add_request(f"g{i}", prompt, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    results = run_to_completion(e)
    for i, prompt in enumerate(PROMPTS):
        assert results[f"g{i}"][0]["token_ids"] == reference_greedy(reference, prompt, 10)
    assert sum(calls["greedy"]) >= 10 * len(PROMPTS)
    assert not any(calls["log_probs"])  # at most steps that score no row (prompt chunks that do not complete)
    # Decode steps of the same sequences take over the step before's inputs, its argmax marks too.
    assert e.runner.num_reused_steps > 0


@pytest.mark.parametrize("requests", [MIXED[:1] * 4, MIXED], ids=["greedy", "mixed"])
def test_the_argmax_shortlist_changes_no_answer(adaptive_pair, monkeypatch, requests):
    _, loaded = adaptive_pair
    requests = [(f"{rid}{i}", params) for i, (rid, params) in enumerate(requests)]
    calls = count_scoring(monkeypatch, loaded.model.adaptive_softmax)
    fast = run_requests(loaded, requests)
    assert calls["greedy"]
    monkeypatch.setattr(loaded.model, "cheap_argmax", False)
    calls["greedy"].clear()
    full = run_requests(loaded, requests)
    assert not calls["greedy"]
    assert fast.keys() == full.keys()
    for rid, outputs in full.items():
        if "prompt_logprobs" in outputs:
            got = [(e.token_id, e.logprob) for e in fast[rid]["prompt_logprobs"][1:]]
            assert got == [(e.token_id, pytest.approx(e.logprob, abs=1e-5)) for e in outputs["prompt_logprobs"][1:]]
        for index, want in outputs.items():
            if index == "prompt_logprobs":
                continue
            have = fast[rid][index]
            assert (have["token_ids"], have["finish_reason"]) == (want["token_ids"], want["finish_reason"]), rid
            assert have["cumulative_logprob"] == pytest.approx(want["cumulative_logprob"], abs=1e-4), rid
            assert [(e.token_id, [t for t, _ in e.top]) for e in have["logprobs"]] == \
                   [(e.token_id, [t for t, _ in e.top]) for e in want["logprobs"]]
            assert [e.logprob for e in have["logprobs"]] == \
                   pytest.approx([e.logprob for e in want["logprobs"]], abs=1e-5)


def test_a_full_output_layer_claims_no_cheaper_argmax(pair):
    _, loaded = pair
    assert loaded.model.cheap_argmax == (loaded.model.adaptive_softmax is not None)
