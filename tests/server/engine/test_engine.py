"""The engine on every architecture: batching never changes an answer, caches are freed, features work."""

from __future__ import annotations

import pytest
import torch

from quill.models.loading.checkpoint import LoadedModel
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.conftest import TEST_DEVICE, build_tiny_model
from tests.server.engine.helpers import run_to_completion

ARCHS = ["lstm", "gcnn", "transformer-llama", "transformer-gpt2"]


def loaded_model(key, tokenizer) -> LoadedModel:
    arch, model = build_tiny_model(key, tokenizer.vocab_size)
    with torch.no_grad():  # logits of a few units: greedy choices are not near-ties, and sampling still varies
        model.embed.weight.mul_(0.3 if arch == "transformer" else 4.0)
    return LoadedModel(key, None, arch, model, tokenizer, [0], TEST_DEVICE, torch.float32)


def engine(loaded, budget=48, prefix=True, max_num_seqs=32) -> EngineCore:
    """Synchronous steps on every device (overlapped ones are test_overlap.py's), so the counts below are exact."""
    return EngineCore(loaded, EngineConfig(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget),
        CacheConfig(block_size=4, num_blocks=512, enable_prefix_caching=prefix), async_scheduling=False,
    ))


def reference_greedy(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids], device=TEST_DEVICE))[0, -1].argmax()))
    return ids[len(prompt):]


PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [3, 4, 5, 6, 7, 8, 20, 21], [50], list(range(60, 90))]


@pytest.fixture(params=ARCHS)
def loaded(request, tiny_tokenizer):
    return loaded_model(request.param, tiny_tokenizer)


def test_greedy_equals_full_forward_alone_and_in_a_busy_batch(loaded):
    expected = [reference_greedy(loaded.model, p, 10) for p in PROMPTS]
    for busy in (False, True):
        e = engine(loaded)
        if busy:
            for i in range(8):
                e.add_request(f"noise{i}", PROMPTS[i % 4][: 2 + i], SamplingParams(max_tokens=4 + i, seed=i, n=1 + i % 3))
        for i, p in enumerate(PROMPTS):
            e.add_request(f"g{i}", p, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
        results = run_to_completion(e)
        for i in range(len(PROMPTS)):
            assert results[f"g{i}"][0]["token_ids"] == expected[i], f"busy={busy} prompt {i}"
        assert e.cache.usage == 0 and not e.scheduler.running and not e.scheduler.waiting


def test_prefix_cache_hits_and_changes_nothing(loaded):
    e = engine(loaded)
    shared = list(range(100, 124))  # six blocks of 4
    e.add_request("first", shared + [1, 2], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    first = run_to_completion(e)["first"][0]["token_ids"]
    hits_before = e.cache.prefix_hits
    e.add_request("second", shared + [1, 2], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    e.add_request("third", shared + [7], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    results = run_to_completion(e)
    assert results["second"][0]["token_ids"] == first
    assert results["third"][0]["token_ids"] == reference_greedy(loaded.model, shared + [7], 6)
    if loaded.model.state_kind == "paged_kv":
        assert e.cache.prefix_hits - hits_before >= 2 * 24 - 8  # most of the shared prefix came from the cache
        return
    # A fixed-size state: the second paused where its prompt met the first's blocks, the third came with it.
    hits_before = e.cache.prefix_hits
    e.add_request("fourth", shared + [9, 9], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    continued = shared + [1, 2] + first + [3]  # the next turn after the first: from where the first stopped
    e.add_request("next turn", continued, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    results = run_to_completion(e)
    assert e.cache.prefix_hits - hits_before == 24 + len(continued) - 2
    assert results["fourth"][0]["token_ids"] == reference_greedy(loaded.model, shared + [9, 9], 6)
    assert results["next turn"][0]["token_ids"] == reference_greedy(loaded.model, continued, 6)


def test_seeded_sampling_is_independent_of_the_batch(loaded):
    params = SamplingParams(max_tokens=12, temperature=3.0, top_p=0.95, seed=1234, n=2, ignore_eos=True)
    e = engine(loaded)
    e.add_request("alone", PROMPTS[0], params)
    alone = run_to_completion(e)["alone"]
    e = engine(loaded, budget=16)
    for i in range(6):
        e.add_request(f"noise{i}", PROMPTS[(i + 1) % 4], SamplingParams(max_tokens=3 + i, temperature=1.3))
    e.add_request("busy", PROMPTS[0], params)
    busy = run_to_completion(e)["busy"]
    assert [busy[i]["token_ids"] for i in range(2)] == [alone[i]["token_ids"] for i in range(2)]
    assert alone[0]["token_ids"] != alone[1]["token_ids"]  # the two samples differ


def test_n_samples_share_the_prompt(loaded):
    e = engine(loaded)
    e.add_request("r", PROMPTS[3], SamplingParams(max_tokens=5, n=4, seed=3, ignore_eos=True))
    while not e.groups["r"].is_forked:  # prefill (in chunks for fixed-size states), then the fork
        e.step()
    assert len(e.groups["r"].seqs) == 4
    if loaded.model.state_kind == "paged_kv":
        tables = [e.cache.block_table(s.seq_id) for s in e.groups["r"].seqs]
        assert all(t[:6] == tables[0][:6] for t in tables)  # the prompt's full blocks are shared
    results = run_to_completion(e)
    assert sorted(results["r"]) == [0, 1, 2, 3]
    assert e.cache.usage == 0


def test_abort_frees_the_cache_at_once(loaded):
    e = engine(loaded)
    e.add_request("a", PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True))
    e.add_request("b", PROMPTS[1], SamplingParams(max_tokens=50, n=3, ignore_eos=True))
    e.step()
    e.step()
    assert e.cache.usage > 0
    assert e.abort("a") and e.abort("b") and not e.abort("b")
    assert e.cache.usage == 0 and not e.has_work()


def test_prompt_logprobs_score_the_prompt(loaded):
    prompt = PROMPTS[3]
    e = engine(loaded, budget=8)  # several chunks
    e.add_request("score", prompt, SamplingParams(max_tokens=1, prompt_logprobs=2))
    scored = run_to_completion(e)["score"]["prompt_logprobs"]
    full = torch.log_softmax(loaded.model(torch.tensor([prompt], device=TEST_DEVICE))[0], dim=-1)
    assert scored[0] is None and len(scored) == len(prompt)
    for t in range(1, len(prompt)):
        assert scored[t].token_id == prompt[t]
        assert scored[t].logprob == pytest.approx(full[t - 1, prompt[t]].item(), abs=1e-4)
        assert [i for i, _ in scored[t].top] == full[t - 1].topk(2).indices.tolist()


def test_logprobs_and_stop_strings(loaded, tiny_tokenizer):
    e = engine(loaded)
    e.add_request("free", PROMPTS[0], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=3))
    free = run_to_completion(e)["free"][0]
    assert len(free["logprobs"]) == 20 and all(len(lp.top) == 3 for lp in free["logprobs"])
    assert all(lp.top[0][0] == lp.token_id for lp in free["logprobs"])  # greedy picks the raw argmax
    text = free["text"]
    assert len(text) >= 6, f"20 greedy tokens should give text to cut a stop string from, got {text!r}"
    stop = text[3:6]
    e.add_request("stopped", PROMPTS[0], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=[stop]))
    stopped = run_to_completion(e)["stopped"][0]
    assert stopped["finish_reason"] == "stop"
    assert stopped["text"] == text[: text.index(stop)]


def test_min_tokens_and_eos(loaded):
    e = engine(loaded)
    eos_bias = {0: 100.0}  # make EOS the obvious next token
    e.add_request("eos", PROMPTS[0], SamplingParams(max_tokens=10, temperature=0, logit_bias=eos_bias))
    e.add_request("min", PROMPTS[0], SamplingParams(max_tokens=10, min_tokens=4, temperature=0, logit_bias=eos_bias))
    results = run_to_completion(e)
    assert results["eos"][0]["token_ids"] == [0] and results["eos"][0]["finish_reason"] == "stop"
    assert len(results["min"][0]["token_ids"]) == 5 and results["min"][0]["finish_reason"] == "stop"


def test_beam_search_runs_for_every_architecture(loaded):
    e = engine(loaded)
    e.add_request("beam", PROMPTS[1], SamplingParams(max_tokens=6, use_beam_search=True, beam_width=3, n=3))
    e.add_request("sampled", PROMPTS[2], SamplingParams(max_tokens=6, seed=1))
    results = run_to_completion(e)
    beams = results["beam"]
    scores = [beams[i]["score"] for i in range(3)]
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(beams[i]["token_ids"]) for i in range(3)}) == 3
    assert e.cache.usage == 0


def test_beams_and_samples_fit_in_few_slots(loaded):
    """Beams fork and drop every step: their seats are reserved, so a tight pool never runs out."""
    e = engine(loaded, max_num_seqs=5)
    for i in range(3):
        e.add_request(f"beam{i}", PROMPTS[i % 4], SamplingParams(max_tokens=8, use_beam_search=True, beam_width=3))
        e.add_request(f"n{i}", PROMPTS[(i + 1) % 4], SamplingParams(max_tokens=8, n=2, seed=i, ignore_eos=True))
    results = run_to_completion(e)
    assert len(results) == 6
    assert e.cache.usage == 0
