"""PyTorch's word_language_model checkpoints, read as the example saves them, against the example's own forward."""

from __future__ import annotations

import sys

import pytest
import torch

from quill.models.loading.checkpoint import load_checkpoint
from quill.models.classic.corpus_vocabulary import corpus_words
from quill.models.classic.conversion import convert
from quill.models.loading.errors import CheckpointError
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.models.classic.wlm_checkpoints import (WORDS, build_rnn_model, build_transformer_model, reference_beam,
                                                  reference_greedy, reference_logits, save_state_dict, save_whole,
                                                  write_corpus)
from tests.models.test_incremental import Cache
from tests.server.engine.helpers import run_to_completion

RNN_TYPES = ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"]
PROMPTS = [[1, 2, 3, 4, 1, 5], [6], [11, 2, 12, 11, 6, 0, 1, 13, 14, 15, 16, 0, 1]]


def original(tmp_path, rnn_type: str, tied: bool = False, whole: bool = True):
    """(the example's model, the directory holding its model.pt and the corpus it was trained on); rnn_type
    "Transformer" is main.py's `--model Transformer`, a TransformerModel."""
    if rnn_type == "Transformer":
        reference = build_transformer_model(tmp_path / "code")
    else:
        reference = build_rnn_model(tmp_path / "code", rnn_type, tied=tied)
    directory = write_corpus(tmp_path / "run")
    (save_whole if whole else save_state_dict)(reference, directory / "model.pt")
    return reference, directory


def test_vocabulary_is_numbered_as_data_corpus_does(tmp_path):
    assert corpus_words(write_corpus(tmp_path)) == WORDS


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("rnn_type", RNN_TYPES)
def test_whole_model_logits_match_the_example(tmp_path, rnn_type, tied):
    reference, directory = original(tmp_path, rnn_type, tied)
    converted = convert(directory)
    config = converted.model.config
    assert (config.cell, config.tie_embeddings, config.output_bias) == (rnn_type.lower(), tied, True)
    for prompt in PROMPTS:
        expected = reference_logits(reference, prompt)
        torch.testing.assert_close(converted.model(torch.tensor([prompt]))[0], expected, atol=1e-5, rtol=0)
        assert_steps_match(converted.model, prompt, expected)  # from the model's state slots


def test_legacy_format_whole_model_is_refused_saying_what_to_do(tmp_path):
    # PyTorch before 1.6 stored a pickled module's class source for the loader to check: not readable safely.
    reference = build_rnn_model(tmp_path / "code", "LSTM")
    directory = write_corpus(tmp_path / "run")
    torch.save(reference, directory / "model.pt", _use_new_zipfile_serialization=False)
    sys.modules.pop("model", None)
    with pytest.raises(CheckpointError, match=r"before 1.6.*save its state_dict\(\)"):
        convert(directory)
    torch.save(reference.state_dict(), directory / "model.pt", _use_new_zipfile_serialization=False)
    torch.testing.assert_close(convert(directory).model(torch.tensor([PROMPTS[0]]))[0],
                               reference_logits(reference, PROMPTS[0]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("rnn_type", ["LSTM", "GRU"])
def test_state_dict_tells_its_cell_by_gate_rows(tmp_path, rnn_type):
    reference, directory = original(tmp_path, rnn_type, whole=False)
    converted = convert(directory / "model.pt")
    assert converted.model.config.cell == rnn_type.lower()
    torch.testing.assert_close(converted.model(torch.tensor([PROMPTS[2]]))[0],
                               reference_logits(reference, PROMPTS[2]), atol=1e-5, rtol=0)


def test_plain_rnn_state_dict_needs_its_nonlinearity_named(tmp_path):
    reference, directory = original(tmp_path, "RNN_RELU", whole=False)
    with pytest.raises(CheckpointError, match="word_language_model_rnn_relu"):
        convert(directory)
    converted = convert(directory, format_name="word_language_model_rnn_relu")
    torch.testing.assert_close(converted.model(torch.tensor([PROMPTS[0]]))[0],
                               reference_logits(reference, PROMPTS[0]), atol=1e-5, rtol=0)


def test_vocabulary_file_or_data_directory_given_apart(tmp_path):
    _, directory = original(tmp_path, "LSTM")
    vocab = tmp_path / "words.txt"
    vocab.write_text("\n".join(WORDS) + "\n")
    data = directory.rename(tmp_path / "elsewhere")
    (tmp_path / "model-only").mkdir()
    model = (data / "model.pt").rename(tmp_path / "model-only" / "model.pt")
    with pytest.raises(CheckpointError, match="do not store their vocabulary"):
        convert(model)
    assert convert(model, vocab).tokenizer.encode("the dog") == convert(model, data).tokenizer.encode("the dog")
    with pytest.raises(CheckpointError, match="gives 3 words but the model has 17"):
        vocab.write_text("the\ncat\nsat\n")
        convert(model, vocab)


def test_newlines_are_the_corpus_line_ends(tmp_path):
    _, directory = original(tmp_path, "LSTM")
    tokenizer = convert(directory).tokenizer
    ids = tokenizer.encode("the cat\nsat on a zebra\n")
    assert [WORDS[i] for i in ids] == ["the", "cat", "<eos>", "sat", "on", "a", "<unk>", "<eos>"]
    assert tokenizer.decode(ids) == "the cat\nsat on a <unk>\n"
    assert tokenizer.eos_token_id is None  # <eos> is a line end: generation goes on past it


def assert_steps_match(model, prompt: list[int], expected: torch.Tensor, log_softmax: bool = False):
    """Chunked prefill, then single-token steps, against `expected` (T, V)."""
    cache = Cache(model, 1, device=torch.device("cpu"))
    chunks = [prompt[:3]] + [[t] for t in prompt[3:]] if len(prompt) > 3 else [prompt]
    stepped = torch.cat([cache.run([0], [chunk])[0] for chunk in chunks])
    torch.testing.assert_close(torch.log_softmax(stepped, -1) if log_softmax else stepped, expected, atol=1e-5, rtol=0)


def test_transformer_model_logits_match_the_example(tmp_path):
    reference, directory = original(tmp_path, "Transformer")
    converted = convert(directory)
    config = converted.model.config
    assert converted.architecture == "transformer" and converted.metadata["model_type"] == "Transformer"
    assert (config.n_heads, config.n_layers, config.d_ff, config.max_seq_len) == (2, 2, 24, 5000)
    assert (config.positional, config.post_norm, config.final_norm, config.output_bias) == ("sinusoidal", True,
                                                                                            False, True)
    for prompt in PROMPTS:
        expected = reference_logits(reference, prompt)  # log_softmax under the example's causal mask
        torch.testing.assert_close(torch.log_softmax(converted.model(torch.tensor([prompt]))[0], -1), expected,
                                   atol=1e-5, rtol=0)
        assert_steps_match(converted.model, prompt, expected, log_softmax=True)


def test_transformer_state_dict_needs_its_heads_named(tmp_path):
    reference, directory = original(tmp_path, "Transformer", whole=False)
    with pytest.raises(CheckpointError, match="word_language_model_nhead<N>"):
        convert(directory)
    converted = convert(directory, format_name="word_language_model_nhead2")
    assert converted.model.config.n_heads == 2
    for prompt in PROMPTS:
        torch.testing.assert_close(torch.log_softmax(converted.model(torch.tensor([prompt]))[0], -1),
                                   reference_logits(reference, prompt), atol=1e-5, rtol=0)
    wrong = convert(directory, format_name="word_language_model_nhead4")  # loads, but is another model
    tokens = torch.tensor([PROMPTS[2]])
    assert not torch.allclose(wrong.model(tokens), converted.model(tokens))


def test_transformer_positions_must_be_the_sinusoidal_table(tmp_path):
    reference, directory = original(tmp_path, "Transformer", whole=False)
    state = reference.state_dict()
    state["pos_encoder.pe"] = state["pos_encoder.pe"] + 0.01
    torch.save(state, directory / "model.pt")
    with pytest.raises(CheckpointError, match="pos_encoder.pe is not the sinusoidal table"):
        convert(directory, format_name="word_language_model_nhead2")


def engine(loaded, budget: int = 64) -> EngineCore:
    return EngineCore(loaded, EngineConfig(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget),
                                           CacheConfig(block_size=4, num_blocks=64)))


@pytest.mark.parametrize("rnn_type", RNN_TYPES + ["Transformer"])
def test_engine_greedy_beam_and_logprobs_match_the_example(tmp_path, rnn_type):
    reference, directory = original(tmp_path, rnn_type, tied=rnn_type == "GRU")
    loaded = load_checkpoint(directory, device="cpu", dtype="float32")  # converted on the way (quill/models/location)
    assert loaded.name == "run" and loaded.metadata["source_format"] == "word_language_model"
    e = engine(loaded, budget=5)  # prompts longer than 5 tokens are prefilled in chunks
    for i, prompt in enumerate(PROMPTS):
        e.add_request(f"greedy{i}", prompt, SamplingParams(max_tokens=8, temperature=0, logprobs=0,
                                                           prompt_logprobs=0))
        e.add_request(f"beam{i}", prompt, SamplingParams(max_tokens=3, use_beam_search=True, beam_width=3, n=3))
    results = run_to_completion(e)
    for i, prompt in enumerate(PROMPTS):
        greedy = results[f"greedy{i}"]
        assert greedy[0]["token_ids"] == reference_greedy(reference, prompt, 8)
        expected = torch.log_softmax(reference_logits(reference, prompt + greedy[0]["token_ids"]), -1)
        got_prompt = [lp.logprob for lp in greedy.get("prompt_logprobs", [None])[1:]]  # none for one token
        want_prompt = [float(expected[j, prompt[j + 1]]) for j in range(len(prompt) - 1)]
        assert got_prompt == pytest.approx(want_prompt, abs=1e-4)
        got = [lp.logprob for lp in greedy[0]["logprobs"]]
        want = [float(expected[len(prompt) - 1 + j, t]) for j, t in enumerate(greedy[0]["token_ids"])]
        assert got == pytest.approx(want, abs=1e-4)
        beams = reference_beam(lambda ids: reference_logits(reference, ids), prompt, 3, 3)
        assert [results[f"beam{i}"][j]["token_ids"] for j in range(3)] == [tokens for tokens, _ in beams]
        assert [results[f"beam{i}"][j]["cumulative_logprob"] for j in range(3)] == pytest.approx(
            [score for _, score in beams], abs=1e-4)


def test_a_vocabulary_without_unk_refuses_unknown_words_as_a_value_error(tmp_path):
    _, directory = original(tmp_path, "LSTM")
    words = [w if w != "<unk>" else "<blank>" for w in WORDS]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    tokenizer = convert(directory, tmp_path / "vocab.txt").tokenizer
    assert tokenizer.encode("the cat") == [1, 2]
    with pytest.raises(ValueError):  # the API answers 400 (quill/server/api/validation.py)
        tokenizer.encode("the zebra")
