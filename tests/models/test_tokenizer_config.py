"""Tokenizers, special tokens and chat templates read as transformers reads them, for every
tiny hub checkpoint: the same prompt ids, the same templates, the same special tokens."""

from __future__ import annotations

import json

import pytest
import transformers

from quill.models.loading.checkpoint import load_checkpoint
from quill.models.text.tokenizer_config import read_tokenizer_config
from tests.conftest import TEXT
from tests.hub_checkpoints import BUILDERS, GEMMA_RAG_TEMPLATE, GEMMA_TEMPLATE, LLAMA3_TEMPLATE

TEXTS = TEXT + ["", " leading space", "trailing space ", "two\nlines", "héllo wörld 🎉", "<|eot_id|>To be</s><s>"]


@pytest.fixture(params=list(BUILDERS), ids=lambda i: i.split("/")[1])
def pair(request, offline_hub):
    auto = transformers.AutoTokenizer.from_pretrained(offline_hub[request.param].path)
    return auto, load_checkpoint(request.param, device="cpu")


def test_encode_matches_auto_tokenizer(pair):
    auto, loaded = pair
    for text in TEXTS:
        assert loaded.tokenizer.encode(text) == auto(text).input_ids, text
        assert loaded.tokenizer.encode(text, add_special_tokens=False) == auto(text, add_special_tokens=False).input_ids


def test_bos_handling_as_the_checkpoint_declares(pair):
    auto, loaded = pair
    starts_with_bos = auto.bos_token_id is not None and auto("To be").input_ids[0] == auto.bos_token_id
    assert loaded.add_bos_token == starts_with_bos


def test_special_tokens_and_templates_match_auto_tokenizer(pair):
    auto, loaded = pair
    assert loaded.special_tokens == auto.special_tokens_map
    assert (loaded.bos_token, loaded.eos_token) == (auto.bos_token, auto.eos_token)
    templates = auto.chat_template
    if isinstance(templates, dict):
        assert loaded.chat_templates == templates
    else:
        assert loaded.chat_template == templates
        assert loaded.chat_templates == ({} if templates is None else {"default": templates})


def test_each_checkpoint_keeps_its_template_where_checkpoints_do(offline_hub):
    llama = load_checkpoint("quill-test/tiny-llama-chat", device="cpu")  # chat_template.jinja
    assert llama.chat_template == LLAMA3_TEMPLATE and llama.add_bos_token and llama.bos_token == "<|begin_of_text|>"
    gemma = load_checkpoint("quill-test/tiny-gemma", device="cpu")  # .jinja + additional_chat_templates/
    assert gemma.chat_templates == {"default": GEMMA_TEMPLATE, "rag": GEMMA_RAG_TEMPLATE}
    phi3 = load_checkpoint("quill-test/tiny-phi3", device="cpu")  # named list in tokenizer_config.json
    assert set(phi3.chat_templates) == {"default", "tool_use"} and not phi3.add_bos_token
    assert load_checkpoint("quill-test/tiny-qwen2", device="cpu").chat_template.startswith("{%- for message")
    assert load_checkpoint("quill-test/tiny-mistral", device="cpu").chat_template is None  # a base model


def test_jinja_file_wins_over_tokenizer_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "from config", "bos_token": "<s>"}))
    assert read_tokenizer_config(tmp_path).chat_template == "from config"
    (tmp_path / "chat_template.jinja").write_text("from file")
    assert read_tokenizer_config(tmp_path).chat_templates == {"default": "from file"}


def test_special_tokens_as_added_token_objects_and_from_the_legacy_map(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<s>", "lstrip": False, "normalized": False, "special": True}, "eos_token": None,
    }))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<ignored>"}))
    assert read_tokenizer_config(tmp_path).special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}


def test_no_tokenizer_config_means_nothing(tmp_path):
    config = read_tokenizer_config(tmp_path)
    assert config.special_tokens == {} and config.chat_template is None and config.chat_templates == {}
