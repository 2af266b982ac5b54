"""fastai AWD-LSTM checkpoints (lstm_fwd.pth + itos_wt103.pkl), against the architecture's own forward, and
fastai's text rules."""

from __future__ import annotations

import collections
import pickle

import pytest
import torch

from quill.models.loading.checkpoint import load_checkpoint
from quill.models.classic.fastai_text import fastai_text, fastai_tokens
from quill.models.classic.conversion import convert
from quill.models.loading.errors import CheckpointError
from quill.models.text.tokenizer import IncrementalDecoder
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.models.classic.awd_checkpoints import ITOS, awd_greedy, awd_logits, build_awd, save_awd
from tests.models.classic.wlm_checkpoints import reference_beam
from tests.models.test_incremental import Cache
from tests.server.engine.helpers import run_to_completion

PROMPTS = [[2, 14, 12, 13, 10], [2], [2, 5, 9, 12, 18, 19, 11, 10, 27, 16, 9, 28, 22, 24, 10]]


@pytest.mark.parametrize("with_opt,legacy", [(True, False), (False, False), (True, True)],
                         ids=["with-opt", "bare", "legacy-format"])
def test_logits_match_the_architecture_full_chunked_and_stepped(tmp_path, with_opt, legacy):
    reference = build_awd()
    converted = convert(save_awd(reference, tmp_path / "wt103", with_opt, legacy))
    config = converted.model.config
    assert (config.layer_sizes, config.d_embed, config.tie_embeddings) == ([12, 12, 8], 8, True)
    for prompt in PROMPTS:
        expected = awd_logits(reference, prompt)
        torch.testing.assert_close(converted.model(torch.tensor([prompt]))[0], expected, atol=1e-5, rtol=0)
        cache = Cache(converted.model, 1, device=torch.device("cpu"))
        chunks = [prompt[:4]] + [[t] for t in prompt[4:]] if len(prompt) > 4 else [prompt]
        stepped = torch.cat([cache.run([0], [chunk])[0] for chunk in chunks])
        torch.testing.assert_close(stepped, expected, atol=1e-5, rtol=0)


def test_engine_greedy_beam_and_logprobs_match(tmp_path):
    reference = build_awd(seed=3)
    loaded = load_checkpoint(save_awd(reference, tmp_path / "wt103") / "lstm_fwd.pth", device="cpu",
                             dtype="float32")
    assert loaded.eos_token_ids == [] and type(loaded.tokenizer).__name__ == "FastaiTokenizer"
    e = EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=6),
                                        CacheConfig(block_size=4, num_blocks=64)))
    for i, prompt in enumerate(PROMPTS):
        e.add_request(f"greedy{i}", prompt, SamplingParams(max_tokens=6, temperature=0, logprobs=0))
        e.add_request(f"beam{i}", prompt, SamplingParams(max_tokens=2, use_beam_search=True, beam_width=2, n=2))
    results = run_to_completion(e)
    for i, prompt in enumerate(PROMPTS):
        got = results[f"greedy{i}"][0]
        assert got["token_ids"] == awd_greedy(reference, prompt, 6)
        expected = torch.log_softmax(awd_logits(reference, prompt + got["token_ids"]), -1)
        want = [float(expected[len(prompt) - 1 + j, t]) for j, t in enumerate(got["token_ids"])]
        assert [lp.logprob for lp in got["logprobs"]] == pytest.approx(want, abs=1e-4)
        best = reference_beam(lambda ids: awd_logits(reference, ids), prompt, 2, 2)
        assert [results[f"beam{i}"][j]["token_ids"] for j in range(2)] == [tokens for tokens, _ in best]


def test_vocabulary_is_read_with_no_class_allowed(tmp_path):
    directory = save_awd(build_awd(), tmp_path / "wt103")
    with open(directory / "itos_wt103.pkl", "wb") as f:  # strings of a class, which the pickle names
        pickle.dump([collections.UserString(w) for w in ITOS], f)
    with pytest.raises(CheckpointError, match="class collections.UserString"):
        convert(directory)


def test_missing_vocabulary_and_wrong_size_are_named(tmp_path):
    directory = save_awd(build_awd(), tmp_path / "wt103")
    (directory / "itos_wt103.pkl").unlink()
    with pytest.raises(CheckpointError, match="itos_wt103.pkl"):
        convert(directory)
    with open(tmp_path / "short.pkl", "wb") as f:
        pickle.dump(ITOS[:5], f)
    with pytest.raises(CheckpointError, match="has 5 words but the model has 31"):
        convert(directory, tmp_path / "short.pkl")


TEXT = "The cat sat on NASA's mat (it's a dog)!!!!\nI don't."
TOKENS = ["xxbos", "xxmaj", "the", "cat", "sat", "on", "xxup", "nasa", "'s", "mat", "(", "it", "'s", "a", "dog", ")",
          "xxrep", "4", "!", "\n", "i", "do", "n't", "."]


def test_fastai_rules_round_trip_a_sentence():
    assert fastai_tokens(TEXT) == TOKENS
    assert fastai_text(TOKENS) == TEXT
    assert fastai_tokens("Hello hello hello world")[1:] == ["xxmaj", "hello", "hello", "hello", "world"]
    assert fastai_tokens("go go go go now")[1:] == ["xxwrep", "4", "go", "now"]
    assert fastai_text(["xxwrep", "3", "go", "xxmaj", "now"]) == "go go go Now"


def test_tokenizer_encodes_and_streams_with_the_rules(tmp_path):
    tokenizer = convert(save_awd(build_awd(), tmp_path / "wt103")).tokenizer
    ids = tokenizer.encode(TEXT)
    assert [ITOS[i] for i in ids] == TOKENS
    assert tokenizer.decode(ids) == TEXT
    assert [ITOS[i] for i in tokenizer.encode("The zebra")] == ["xxbos", "xxmaj", "the", "xxunk"]
    prompt = tokenizer.encode("The cat")
    decoder = IncrementalDecoder(tokenizer, prompt)
    continuation = tokenizer.encode("sat on NASA's mat (it's a dog)!!!!\nI don't.", add_special_tokens=False)
    deltas = [decoder.push(i) for i in continuation] + [decoder.flush()]
    assert "".join(deltas) == tokenizer.decode_continuation(prompt, continuation)
    assert "".join(deltas) == " sat on NASA's mat (it's a dog)!!!!\nI don't."
