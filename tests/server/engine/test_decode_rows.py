"""The runner's persistent batch (runner/decode_rows.py) gives exactly the answers of packing every step whole.

Each scenario runs twice on the same requests, arriving before the same steps: once as the engine runs, once with
the persistent batch turned off (every step packed whole, as the runner did before it). Requests finish at
staggered lengths and new ones arrive while others decode, so steps keep some rows, drop others and pack new ones
behind them; the counters say that those steps really took the persistent path. A tiny real model reads its
inputs, so a wrong position, cache-table row or input token changes the answers; seeded sampling rows check that
every row samples with its own settings and generator.
"""

from __future__ import annotations

import pytest

from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.runner import decode_rows
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.server.engine.test_engine import loaded_model
from tests.server.engine.test_overlap import drive

GREEDY = dict(temperature=0.0)
SEEDED = dict(temperature=0.9, top_k=20, top_p=0.95, seed=11)


def make_engine(loaded, async_scheduling: bool, num_blocks: int = 512, max_num_seqs: int = 8) -> EngineCore:
    return EngineCore(loaded, EngineConfig(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=32),
        CacheConfig(block_size=4, num_blocks=num_blocks), async_scheduling=async_scheduling,
    ))


def churn(settings: list[dict], extra: dict | None = None) -> dict[int, list]:
    """Requests with staggered lengths (one finishing every few steps), more arriving every third step."""
    arrivals: dict[int, list] = {}
    for i in range(12):
        params = SamplingParams(max_tokens=6 + 3 * i, ignore_eos=True, **settings[i % len(settings)])
        arrivals.setdefault(3 * i if i >= 4 else 0, []).append((f"r{i}", [5 + i, 9, 13 + 2 * i, 4][: 2 + i % 3],
                                                                params))
    for step, request in (extra or {}).items():
        arrivals.setdefault(step, []).append(request)
    return arrivals


def run_both(loaded, arrivals, monkeypatch, **engine_options) -> tuple[dict, dict, EngineCore]:
    with_rows = make_engine(loaded, **engine_options)
    kept, _ = drive(with_rows, arrivals)
    with monkeypatch.context() as m:
        m.setattr(decode_rows.DecodeRows, "of", staticmethod(lambda *args, **kwargs: None))
        whole = make_engine(loaded, **engine_options)
        packed, _ = drive(whole, arrivals)
        assert whole.runner.num_delta_steps == whole.runner.num_reused_steps == 0  # really packed whole
    return kept, packed, with_rows


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "overlapped"])
@pytest.mark.parametrize("arch", ["transformer-llama", "lstm"])
def test_rows_kept_and_dropped_give_the_answers_of_whole_packing(tiny_tokenizer, monkeypatch, arch, async_scheduling):
    loaded = loaded_model(arch, tiny_tokenizer)
    kept, packed, engine = run_both(loaded, churn([GREEDY, SEEDED]), monkeypatch, async_scheduling=async_scheduling)
    assert kept == packed and len(kept) == 12
    assert engine.runner.num_delta_steps > 5 and engine.runner.num_reused_steps > 5


def test_requests_the_rows_cannot_hold_are_packed_whole_beside_them(tiny_tokenizer, monkeypatch):
    """Beam search, n samples, logprobs, penalties and logit bias arrive among plain decodes: the steps they join
    are packed whole (or, logprobs, kept: they need no more than a plain row), and nobody's answer changes."""
    loaded = loaded_model("transformer-llama", tiny_tokenizer)
    extra = {
        4: ("beam", [3, 4, 5], SamplingParams(max_tokens=5, use_beam_search=True, beam_width=2, ignore_eos=True)),
        7: ("n2", [6, 7], SamplingParams(max_tokens=6, n=2, temperature=0.8, seed=3, ignore_eos=True)),
        9: ("logprobs", [8, 9], SamplingParams(max_tokens=7, logprobs=2, temperature=0, ignore_eos=True)),
        11: ("penalty", [10, 11], SamplingParams(max_tokens=6, presence_penalty=1.0, temperature=0,
                                                 ignore_eos=True)),
        13: ("bias", [12, 13], SamplingParams(max_tokens=6, logit_bias={7: 5.0}, temperature=0, ignore_eos=True)),
    }
    kept, packed, engine = run_both(loaded, churn([GREEDY, SEEDED], extra), monkeypatch, async_scheduling=False)
    assert kept.keys() == packed.keys() and len(kept) == 17
    for request_id, outputs in packed.items():
        for index, want in outputs.items():
            have = kept[request_id][index]
            assert (have["token_ids"], have["finish_reason"]) == (want["token_ids"], want["finish_reason"]), request_id
            assert have["cumulative_logprob"] == pytest.approx(want["cumulative_logprob"], abs=1e-5), request_id
            assert [(e.token_id, e.top) for e in have["logprobs"]] == \
                   [(e.token_id, e.top) for e in want["logprobs"]], request_id
    assert engine.runner.num_delta_steps > 5


def test_preempted_rows_come_back_packed_whole(tiny_tokenizer, monkeypatch):
    """A cache too small for everyone: sequences are preempted (their cache-table rows freed) and readmitted;
    a freed row is never kept, so a readmitted sequence's new table row and position are read afresh."""
    loaded = loaded_model("transformer-llama", tiny_tokenizer)
    kept, packed, engine = run_both(loaded, churn([GREEDY]), monkeypatch, async_scheduling=False, num_blocks=24)
    assert engine.scheduler.num_preemptions > 0
    assert kept == packed and len(kept) == 12


def test_all_greedy_rows_with_logprobs_share_one_set_of_settings(tiny_tokenizer, monkeypatch):
    """Rows that are all greedy skip gathering their settings (they are all the same): their tokens and their
    log-probabilities are those of packing whole."""
    loaded = loaded_model("transformer-llama", tiny_tokenizer)
    kept, packed, engine = run_both(loaded, churn([dict(temperature=0, logprobs=2), GREEDY]), monkeypatch,
                                    async_scheduling=False)
    assert kept.keys() == packed.keys() and engine.runner.num_delta_steps > 5
    for request_id, outputs in packed.items():
        have, want = kept[request_id][0], outputs[0]
        assert have["token_ids"] == want["token_ids"]
        assert [(e.token_id, [t for t, _ in e.top]) for e in have["logprobs"]] == \
               [(e.token_id, [t for t, _ in e.top]) for e in want["logprobs"]]
        # the forward pass of a batch packed otherwise rounds otherwise: equal to float32 rounding
        values = [[e.logprob] + [lp for _, lp in e.top] for e in have["logprobs"]]
        assert values == [pytest.approx([e.logprob] + [lp for _, lp in e.top], abs=1e-5) for e in want["logprobs"]]
