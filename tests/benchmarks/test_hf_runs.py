"""The generate() baseline on a tiny GPT-2: decoding options mapped, static batches grouped and counted."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from benchmarks.common import hf_runs
from benchmarks.common.tokenized import TokenizedRequest


@pytest.fixture(scope="module")
def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=64,
                                     eos_token_id=0, pad_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def request(i: int, prompt_len: int, max_tokens: int, **options) -> TokenizedRequest:
    return TokenizedRequest(f"r{i}", list(range(1, prompt_len + 1)), max_tokens, options or {"temperature": 0}, i)


def test_client_options_become_generate_arguments():
    assert hf_runs.generate_kwargs({"temperature": 0}, 7) == dict(max_new_tokens=7, min_new_tokens=7, do_sample=False)
    beam = hf_runs.generate_kwargs({"beam_width": 4}, 5)
    assert beam["num_beams"] == 4 and beam["do_sample"] is False and beam["num_return_sequences"] == 1
    top_p = hf_runs.generate_kwargs({"temperature": 1.0, "top_p": 0.9, "n": 2}, 5)
    assert top_p["do_sample"] and top_p["top_p"] == 0.9 and top_p["top_k"] == 0 and top_p["num_return_sequences"] == 2
    assert hf_runs.generate_kwargs({"temperature": 1.0, "min_p": 0.05}, 5)["min_p"] == 0.05


def test_static_batches_group_by_setting_and_count_padding(tiny_gpt2):
    requests = [request(0, 3, 2), request(1, 5, 6), request(2, 4, 3, temperature=1.0, n=2), request(3, 2, 4)]
    run = hf_runs.static_batches(tiny_gpt2, requests, batch_size=2, pad_id=0)
    assert run.num_batches == 3  # greedy: [0, 1], [3]; sampling: [2]
    assert run.generated_tokens == 2 + 6 + 3 * 2 + 4
    assert run.computed_tokens == 2 * 6 + 4 + 3 * 2  # every row runs to its batch's longest
    assert run.tokens_per_s > 0 and run.computed_tokens_per_s >= run.tokens_per_s


def test_serial_and_decode_generate_exactly_max_tokens(tiny_gpt2):
    run = hf_runs.serial(tiny_gpt2, [request(0, 3, 4), request(1, 6, 2, beam_width=2)], pad_id=0)
    assert run.num_requests == 2 and run.generated_tokens == 6
    start, times = hf_runs.decode(tiny_gpt2, request(2, 4, 5), pad_id=0)
    assert len(times) == 5 and times[0] >= start
