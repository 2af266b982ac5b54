"""generation_config.json: its EOS ids join config.json's; its sampling defaults are exposed
(with vLLM's six names) and its one-token bad words banned, unless turned off."""

from __future__ import annotations

import json
import shutil

import pytest

from quill.models.loading.checkpoint import CheckpointError, load_checkpoint
from quill.models.loading.generation_config import read_generation_config

LLAMA = "quill-test/tiny-llama-chat"


def test_eos_list_longer_than_config_json_joins_it(offline_hub):
    checkpoint = offline_hub[LLAMA]
    config_eos = json.loads((checkpoint.path / "config.json").read_text())["eos_token_id"]
    generation_eos = json.loads((checkpoint.path / "generation_config.json").read_text())["eos_token_id"]
    assert isinstance(config_eos, int) and len(generation_eos) == 3
    loaded = load_checkpoint(LLAMA, device="cpu")
    assert loaded.eos_token_ids == [config_eos] + [i for i in generation_eos if i != config_eos]
    assert loaded.tokenizer.eos_token_id == config_eos


def test_sampling_defaults_under_sampling_params_names(offline_hub):
    loaded = load_checkpoint(LLAMA, device="cpu")
    assert loaded.generation_defaults == {"temperature": 0.6, "top_p": 0.9, "max_tokens": 64}


def test_generation_config_none_drops_the_defaults_but_not_the_eos_ids(offline_hub):
    auto = load_checkpoint(LLAMA, device="cpu")
    none = load_checkpoint(LLAMA, device="cpu", generation_config="none")
    assert none.generation_defaults == {} and none.eos_token_ids == auto.eos_token_ids
    with pytest.raises(ValueError, match="generation_config must be one of"):
        load_checkpoint(LLAMA, device="cpu", generation_config="vllm")


def test_every_setting_and_its_type(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "eos_token_id": 7, "temperature": 1, "top_p": 0.8, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
        "max_new_tokens": 100, "do_sample": True, "num_beams": 1, "max_length": 4096,
    }))
    config = read_generation_config(tmp_path)
    assert config.eos_token_ids == [7]
    assert config.defaults == {"temperature": 1.0, "top_p": 0.8, "top_k": 20, "min_p": 0.05,
                               "repetition_penalty": 1.1, "max_tokens": 100}
    assert isinstance(config.defaults["temperature"], float) and isinstance(config.defaults["top_k"], int)


def test_missing_file_means_nothing(tmp_path):
    config = read_generation_config(tmp_path)
    assert config.eos_token_ids == [] and config.defaults == {}


@pytest.mark.parametrize("content, fragment", [
    ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
    ({"top_k": 2.5}, "top_k must be an integer"),
    ({"eos_token_id": [1, True]}, "eos_token_id must be an integer"),
    ({"bad_words_ids": [5]}, "bad_words_ids must be a list of non-empty lists"),
    ({"bad_words_ids": [[5, "x"]]}, "bad_words_ids must be an integer"),
    ({"bad_words_ids": [[5, 10**6]]}, "token id 1000000 is not in the model's vocabulary"),
    ({"forced_eos_token_id": -1}, "token id -1 is not in the model's vocabulary"),
    ([1, 2], "must hold a JSON object"),
])
def test_bad_values_name_the_file(tmp_path, offline_hub, content, fragment):
    shutil.copytree(offline_hub[LLAMA].path, tmp_path / "llama")
    (tmp_path / "llama" / "generation_config.json").write_text(json.dumps(content))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path / "llama", device="cpu")
    assert "generation_config.json" in str(info.value) and fragment in str(info.value)


def test_bad_words_and_forced_eos_are_read_and_lifted_by_none(tmp_path, offline_hub):
    shutil.copytree(offline_hub[LLAMA].path, tmp_path / "llama")
    (tmp_path / "llama" / "generation_config.json").write_text(json.dumps(
        {"bad_words_ids": [[9], [4, 5], [3], [9]], "forced_eos_token_id": 2}))
    assert read_generation_config(tmp_path / "llama").bad_words_ids == [[9], [4, 5], [3], [9]]
    loaded = load_checkpoint(tmp_path / "llama", device="cpu")
    assert (loaded.banned_token_ids, loaded.bad_words_ids, loaded.forced_eos_token_ids) == ([3, 9], [[4, 5]], [2])
    lifted = load_checkpoint(tmp_path / "llama", device="cpu", generation_config="none")
    assert (lifted.banned_token_ids, lifted.bad_words_ids, lifted.forced_eos_token_ids) == ([], [], [])


def test_forced_eos_comes_from_config_json_without_a_generation_config(tmp_path, offline_hub):
    """transformers derives the generation config from config.json when the checkpoint ships none."""
    shutil.copytree(offline_hub[LLAMA].path, tmp_path / "llama")
    (tmp_path / "llama" / "generation_config.json").unlink(missing_ok=True)
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    (tmp_path / "llama" / "config.json").write_text(json.dumps({**config, "forced_eos_token_id": [2, 3]}))
    assert load_checkpoint(tmp_path / "llama", device="cpu").forced_eos_token_ids == [2, 3]
    (tmp_path / "llama" / "generation_config.json").write_text(json.dumps({"temperature": 0.5}))
    assert load_checkpoint(tmp_path / "llama", device="cpu").forced_eos_token_ids == []  # the file wins


def test_beam_defaults_keep_only_valid_settings_and_are_lifted_by_none(tmp_path, offline_hub):
    """generate()'s unasked decoding (what LibreTranslate applies): valid settings under SamplingParams names, the
    others left out without failing the load; max_length as written."""
    shutil.copytree(offline_hub[LLAMA].path, tmp_path / "llama")
    path = tmp_path / "llama" / "generation_config.json"
    path.write_text(json.dumps({"num_beams": 5, "length_penalty": 0.6, "early_stopping": "never",
                                "no_repeat_ngram_size": 3, "max_length": 200}))
    config = read_generation_config(tmp_path / "llama")
    assert config.beam_defaults == {"beam_width": 5, "length_penalty": 0.6, "early_stopping": "never",
                                    "no_repeat_ngram_size": 3}
    assert config.max_length == 200
    path.write_text(json.dumps({"num_beams": 0, "length_penalty": True, "early_stopping": "sometimes",
                                "no_repeat_ngram_size": -1, "max_length": "long"}))
    config = read_generation_config(tmp_path / "llama")
    assert config.beam_defaults == {} and config.max_length is None
    path.write_text(json.dumps({"num_beams": 4, "max_length": 64}))
    loaded = load_checkpoint(tmp_path / "llama", device="cpu")
    assert (loaded.beam_defaults, loaded.max_length) == ({"beam_width": 4}, 64)
    lifted = load_checkpoint(tmp_path / "llama", device="cpu", generation_config="none")
    assert (lifted.beam_defaults, lifted.max_length) == ({}, None)
