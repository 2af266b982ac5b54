"""Completion text is decode(prompt + output) minus decode(prompt), in both dialects.

Over a byte-level (GPT-2) and a Metaspace (SentencePiece: Llama, Mistral) tokenizer: plain and streamed,
with stop strings, special tokens skipped or shown, n samples and beam search. The models are scripted
(tests/conftest.py: each token is followed by the next of a cycle), so the output ids are known here and
the expected text is computed from them, not from the server. The cycle has a special token, and for
the byte-level tokenizer an emoji whose bytes are separate tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer

from quill.models.loading.checkpoint import save_checkpoint
from quill.models.text.tokenizer import Tokenizer
from quill.server.api.app import create_app
from quill.server.hosting import ModelHost
from tests.conftest import build_hf_tokenizer, build_metaspace_tokenizer, build_scripted_transformer
from tests.server.api.conftest import server_config

PROMPT = "To be, or"
MAX_TOKENS = 12


def bytelevel_with_a_special_token() -> HFTokenizer:
    hf = build_hf_tokenizer()
    hf.add_special_tokens(["<sep>"])
    return hf


@dataclass
class Scripted:
    """A hosted scripted model, and what it answers to PROMPT."""

    tokenizer: Tokenizer
    cycle: list[int]  # starts with PROMPT's last token
    stop: str  # a stop string spanning two tokens of the output text (special tokens skipped)

    @property
    def prompt_ids(self) -> list[int]:
        return self.tokenizer.encode(PROMPT)

    def output_ids(self, num_tokens: int) -> list[int]:
        start = self.cycle.index(self.prompt_ids[-1])
        return [self.cycle[(start + 1 + i) % len(self.cycle)] for i in range(num_tokens)]

    def text(self, num_tokens: int = MAX_TOKENS, skip_special_tokens: bool = True) -> str:
        """The contract, computed from the known ids."""
        prompt, output = self.prompt_ids, self.output_ids(num_tokens)
        full = self.tokenizer.decode(prompt + output, skip_special_tokens)
        return full[len(self.tokenizer.decode(prompt, skip_special_tokens)) :]

    def tokens_to_stop(self) -> int:
        """How many tokens until the output text first holds the stop string."""
        return next(k for k in range(1, MAX_TOKENS + 1) if self.stop in self.text(k))


# What follows PROMPT: the Metaspace model answers " not to<sep> the mind ...", where decoding the output
# alone would drop the first space; the byte-level one " not 🎉<sep>mind ...", the emoji in four byte tokens.
MODELS = {
    "scripted-metaspace": (lambda: Tokenizer(build_metaspace_tokenizer(), 2), "not to<sep> the mind", "to the"),
    "scripted-bytelevel": (lambda: Tokenizer(bytelevel_with_a_special_token(), 0), " not 🎉<sep>mind", "🎉mi"),
}


@pytest.fixture(scope="module")
def scripted(tmp_path_factory) -> dict[str, Scripted]:
    models = {}
    for name, (build, continuation, stop) in MODELS.items():
        tokenizer = build()
        cycle = tokenizer.encode(PROMPT)[-1:] + tokenizer.encode(continuation)
        assert len(set(cycle)) == len(cycle) and tokenizer.eos_token_id not in cycle
        models[name] = Scripted(tokenizer, cycle, stop)
    return models


@pytest.fixture(scope="module")
def app(scripted, tmp_path_factory):
    root = tmp_path_factory.mktemp("scripted")
    paths = {}
    for name, s in scripted.items():
        arch, model = build_scripted_transformer(s.tokenizer.vocab_size, s.cycle)
        paths[name] = str(save_checkpoint(root / name, arch, model, s.tokenizer, dtype=torch.float32))
    config = server_config(paths)
    host = ModelHost.load(config)
    host.start()
    yield create_app(host, config)
    host.shutdown()


@pytest.fixture(params=list(MODELS))
def model(request, scripted) -> tuple[str, Scripted]:
    return request.param, scripted[request.param]


def sse_payloads(body: str) -> list:
    payloads = []
    for block in body.strip().split("\n\n"):
        assert block.startswith("data:"), block
        data = block[len("data:") :].strip()
        payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


async def test_the_models_answer_as_scripted(client, model):
    name, s = model
    r = await client.post("/generate", json={"inputs": PROMPT, "model": name,
                                             "parameters": {"max_new_tokens": MAX_TOKENS, "details": True}})
    assert r.status_code == 200, r.text
    assert [t["id"] for t in r.json()["details"]["tokens"]] == s.output_ids(MAX_TOKENS)


# ---- OpenAI /v1/completions ------------------------------------------------------------------


async def complete(client, name: str, **body) -> dict:
    r = await client.post("/v1/completions", json={"model": name, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                                   "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


async def complete_streamed(client, name: str, **body) -> list[str]:
    r = await client.post("/v1/completions", json={"model": name, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                                   "temperature": 0, "stream": True, **body})
    assert r.status_code == 200, r.text
    payloads = sse_payloads(r.text)
    assert payloads[-1] == "[DONE]"
    return [c["choices"][0]["text"] for c in payloads[:-1]]


@pytest.mark.parametrize("skip", [True, False], ids=["skip_special", "show_special"])
async def test_openai_text_is_the_prompt_continuation(client, model, skip):
    name, s = model
    expected = s.text(skip_special_tokens=skip)
    assert expected.startswith(" not")  # the space the first token carries
    assert ("<sep>" in expected) is not skip
    plain = await complete(client, name, skip_special_tokens=skip)
    assert plain["choices"][0]["text"] == expected
    chunks = await complete_streamed(client, name, skip_special_tokens=skip)
    assert "".join(chunks) == expected
    assert chunks[0].startswith(" ") and not any("\ufffd" in c for c in chunks)  # no half emoji either


async def test_openai_stop_string_cuts_the_continuation(client, model):
    name, s = model
    full = s.text(s.tokens_to_stop())
    expected = full[: full.index(s.stop)]
    plain = await complete(client, name, stop=[s.stop])
    assert plain["choices"][0] | {"logprobs": None} == {"index": 0, "text": expected, "logprobs": None,
                                                          "finish_reason": "stop"}
    assert "".join(await complete_streamed(client, name, stop=[s.stop])) == expected


async def test_openai_echo_spells_the_whole_decoded_text(client, model):
    name, s = model
    ids = s.prompt_ids
    echoed = await complete(client, name, prompt=ids, echo=True, skip_special_tokens=False)
    full = s.tokenizer.decode(ids + s.output_ids(MAX_TOKENS), skip_special_tokens=False)
    assert echoed["choices"][0]["text"] == full


@pytest.mark.parametrize("skip", [True, False], ids=["skip_special", "show_special"])
async def test_openai_samples_and_beams_follow_the_contract(client, model, skip):
    name, s = model
    samples = await complete(client, name, n=2, skip_special_tokens=skip)
    assert [c["text"] for c in samples["choices"]] == [s.text(skip_special_tokens=skip)] * 2
    beams = await complete(client, name, use_beam_search=True, best_of=2, skip_special_tokens=skip)
    assert beams["choices"][0]["text"] == s.text(skip_special_tokens=skip)


async def test_openai_logprobs_tokens_spell_the_continuation(client, model):
    """Each token's text is what it adds after those before it: a span per token draws the text exactly
    (a Metaspace token keeps its space, a byte piece of the emoji adds "" until the piece that ends it)."""
    name, s = model
    expected = s.text(skip_special_tokens=False)
    plain = (await complete(client, name, logprobs=2, skip_special_tokens=False))["choices"][0]
    assert plain["text"] == expected and "".join(plain["logprobs"]["tokens"]) == expected
    tokens = plain["logprobs"]["tokens"]
    assert tokens[0] == s.text(1, skip_special_tokens=False) and tokens[0].startswith(" ")
    assert plain["logprobs"]["text_offset"] == [len("".join(tokens[:i])) for i in range(len(tokens))]
    # Greedy: each step's likeliest alternative is the chosen token; it reads as that token in place.
    for token, top in zip(tokens, plain["logprobs"]["top_logprobs"]):
        if token and "\ufffd" not in token:
            assert max(top, key=top.get) == token
    r = await client.post("/v1/completions", json={"model": name, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                                   "temperature": 0, "stream": True, "logprobs": 1,
                                                   "skip_special_tokens": False})
    chunks = [c["choices"][0] for c in sse_payloads(r.text)[:-1]]
    streamed = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert streamed == tokens
    offsets = [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    assert offsets == plain["logprobs"]["text_offset"]


async def test_openai_echoed_logprobs_tokens_spell_prompt_and_continuation(client, model):
    name, s = model
    ids = s.prompt_ids
    echoed = (await complete(client, name, prompt=ids, echo=True, logprobs=0, skip_special_tokens=False))
    tokens = echoed["choices"][0]["logprobs"]["tokens"]
    assert len(tokens) == len(ids) + MAX_TOKENS
    assert "".join(tokens) == s.tokenizer.decode(ids + s.output_ids(MAX_TOKENS), skip_special_tokens=False)


# ---- TGI /generate and /generate_stream ------------------------------------------------------


async def generate(client, name: str, route: str = "/generate", **parameters):
    r = await client.post(route, json={"inputs": PROMPT, "model": name,
                                       "parameters": {"max_new_tokens": MAX_TOKENS, **parameters}})
    assert r.status_code == 200, r.text
    return r


async def test_tgi_generated_text_is_the_prompt_continuation(client, model):
    name, s = model
    body = (await generate(client, name, details=True)).json()
    assert body["generated_text"] == s.text()
    # Token texts show special tokens (flagged), and continue one another from the prompt.
    tokens = body["details"]["tokens"]
    assert "".join(t["text"] for t in tokens) == s.text(skip_special_tokens=False)
    assert [t["special"] for t in tokens] == [t["text"] == "<sep>" for t in tokens]
    full = (await generate(client, name, return_full_text=True)).json()["generated_text"]
    assert full == PROMPT + s.text()


async def test_tgi_stream_is_the_prompt_continuation(client, model):
    name, s = model
    events = sse_payloads((await generate(client, name, route="/generate_stream")).text)
    assert len(events) == MAX_TOKENS
    assert events[-1]["generated_text"] == s.text()
    texts = [e["token"]["text"] for e in events]
    assert "".join(texts) == s.text(skip_special_tokens=False)
    assert texts[0] == s.text(1, skip_special_tokens=False) and texts[0].startswith(" ")  # its space kept
    assert not any("\ufffd" in t for t in texts)


async def test_tgi_stop_sequence_is_kept(client, model):
    name, s = model
    num_tokens = s.tokens_to_stop()
    body = (await generate(client, name, stop=[s.stop], details=True)).json()
    assert body["generated_text"] == s.text(num_tokens) and s.stop in body["generated_text"]
    assert body["details"]["finish_reason"] == "stop_sequence"
    assert body["details"]["generated_tokens"] == num_tokens
    events = sse_payloads((await generate(client, name, route="/generate_stream", stop=[s.stop])).text)
    assert events[-1]["generated_text"] == s.text(num_tokens)


async def test_tgi_beam_search_text_is_the_prompt_continuation(client, model):
    name, s = model
    body = (await generate(client, name, num_beams=2)).json()
    assert body["generated_text"] == s.text()
