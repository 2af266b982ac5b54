"""Engine outputs against Hugging Face `generate` on the same GPT-2 and Llama checkpoints.

Greedy and beam search must give the same tokens (and beam scores within 1e-4), whether
a request runs alone or inside a busy batch of other requests.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from quill.models.loading.checkpoint import load_checkpoint
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.conftest import TEST_DEVICE, build_hf_tokenizer
from tests.server.engine.helpers import run_to_completion

V = 300
EOS = 5  # a common token, so that some sequences really end on it


def hf_model(kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=128, eos_token_id=EOS, bos_token_id=EOS,
            pad_token_id=EOS,
        )
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, eos_token_id=EOS, bos_token_id=1, pad_token_id=EOS,
        )
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # sharpen the distribution a little so greedy paths are not all ties of noise
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    reference = hf_model(request.param)
    reference.save_pretrained(directory, safe_serialization=True)
    build_hf_tokenizer(V).save(str(directory / "tokenizer.json"))
    return reference.to(TEST_DEVICE), load_checkpoint(directory, device=TEST_DEVICE, dtype="float32")


PROMPTS = [[10, 20, 30, 40, 50], [7, 8, 9], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112], [42]]


def engine(loaded, **kw) -> EngineCore:
    return EngineCore(loaded, EngineConfig(
        SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=kw.pop("budget", 64)),
        CacheConfig(block_size=4, num_blocks=kw.pop("num_blocks", 256)),
    ))


def busy_neighbours(e: EngineCore, count: int = 6) -> None:
    """Other traffic: sampled requests with various settings, sharing a prefix with the tests' prompts."""
    for i in range(count):
        e.add_request(
            f"noise{i}", PROMPTS[i % len(PROMPTS)] + [i + 1] * (i + 2),
            SamplingParams(max_tokens=5 + 3 * i, temperature=0.9, top_k=20, n=1 + i % 2, seed=i),
        )


def hf_greedy(reference, prompt, max_new_tokens):
    out = reference.generate(torch.tensor([prompt], device=TEST_DEVICE), do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("busy", [False, True])
def test_greedy_matches_transformers(pair, busy):
    reference, loaded = pair
    e = engine(loaded)
    if busy:
        busy_neighbours(e)
    for i, prompt in enumerate(PROMPTS):
        e.add_request(f"greedy{i}", prompt, SamplingParams(max_tokens=12, temperature=0))
    results = run_to_completion(e)
    for i, prompt in enumerate(PROMPTS):
        assert results[f"greedy{i}"][0]["token_ids"] == hf_greedy(reference, prompt, 12)
    assert e.cache.usage == 0


BEAM_CASES = [
    dict(num_beams=3, n=2, length_penalty=1.0, early_stopping=False, max_new_tokens=10),
    dict(num_beams=4, n=4, length_penalty=0.5, early_stopping=True, max_new_tokens=8),
    dict(num_beams=2, n=1, length_penalty=2.0, early_stopping="never", max_new_tokens=9),
]


@pytest.mark.parametrize("case", BEAM_CASES, ids=lambda c: f"B{c['num_beams']}-n{c['n']}-{c['early_stopping']}")
@pytest.mark.parametrize("busy", [False, True])
def test_beam_search_matches_transformers(pair, case, busy):
    reference, loaded = pair
    e = engine(loaded)
    if busy:
        busy_neighbours(e)
    params = SamplingParams(
        max_tokens=case["max_new_tokens"], use_beam_search=True, beam_width=case["num_beams"], n=case["n"],
        length_penalty=case["length_penalty"], early_stopping=case["early_stopping"],
    )
    for i, prompt in enumerate(PROMPTS):
        e.add_request(f"beam{i}", prompt, params)
    results = run_to_completion(e)
    for i, prompt in enumerate(PROMPTS):
        expected = reference.generate(
            torch.tensor([prompt], device=TEST_DEVICE), do_sample=False, num_beams=case["num_beams"],
            num_return_sequences=case["n"],
            length_penalty=case["length_penalty"], early_stopping=case["early_stopping"],
            max_new_tokens=case["max_new_tokens"], output_scores=True, return_dict_in_generate=True,
        )
        got = results[f"beam{i}"]
        for j in range(case["n"]):
            want_ids = expected.sequences[j, len(prompt):].tolist()
            # transformers pads shorter beams with the pad token (here EOS) after their end.
            while len(want_ids) > len(got[j]["token_ids"]) and want_ids[-1] == EOS:
                want_ids.pop()
            assert got[j]["token_ids"] == want_ids, f"prompt {i}, beam {j}"
            assert got[j]["score"] == pytest.approx(expected.sequences_scores[j].item(), abs=1e-4)
    assert e.cache.usage == 0


def test_greedy_survives_preemption(pair):
    """A cache too small for everyone at once: requests are preempted, recomputed, and still match."""
    reference, loaded = pair
    e = engine(loaded, num_blocks=14, budget=32)
    for i, prompt in enumerate(PROMPTS):
        e.add_request(f"greedy{i}", prompt, SamplingParams(max_tokens=14, temperature=0, ignore_eos=True))
    results = run_to_completion(e)
    assert e.scheduler.num_preemptions > 0
    for i, prompt in enumerate(PROMPTS):
        want = reference.generate(
            torch.tensor([prompt], device=TEST_DEVICE), do_sample=False, max_new_tokens=14, min_new_tokens=14
        )[0, len(prompt):].tolist()
        assert results[f"greedy{i}"][0]["token_ids"] == want
    assert e.cache.usage == 0
