"""lm-evaluation-harness's `local-completions` model against a live server with no tokenizer of its own: it finds
/tokenizer_info and /tokenize by itself (tokenizer_backend "auto" becomes "remote"), tokenizes a loglikelihood
request's context and continuation through the server, and scores the continuation from /v1/completions'
echoed prompt log-probabilities. Its answer must be the sum the server gives for those very tokens.

lm-eval, with aiohttp and tenacity that its API models import, is in the `test` extra; the skips below are for an
environment made some other way."""

from __future__ import annotations

import math

import httpx
import pytest

from tests.conftest import LiveServer

pytest.importorskip("aiohttp", reason="lm-eval's API models need aiohttp: pip install aiohttp tenacity")
pytest.importorskip("tenacity", reason="lm-eval's API models need tenacity: pip install aiohttp tenacity")
completions = pytest.importorskip("lm_eval.models.openai_completions",
                                  reason="pip install --no-deps lm-eval==0.4.13 (see this module's docstring)")

CONTEXT, CONTINUATION = "To be, or not to be,", " that is the question"


@pytest.fixture(scope="module")
def server(tiny_checkpoints):
    with LiveServer({"tiny-transformer": tiny_checkpoints["tiny-transformer"]}) as live:
        yield live


def test_loglikelihood_through_the_servers_tokenizer(server):
    from lm_eval.api.instance import Instance

    lm = completions.LocalCompletionsAPI(base_url=f"{server.url}/v1/completions", model="tiny-transformer",
                                         max_length=64, timeout=30)
    assert lm.tokenizer_backend == "remote"
    assert lm.eot_token_id == lm.prefix_token_id == 0  # "<|endoftext|>", encoded by the server
    request = Instance(request_type="loglikelihood", doc={}, arguments=(CONTEXT, CONTINUATION), idx=0)
    ((logprob, is_greedy),) = lm.loglikelihood([request], disable_tqdm=True)

    with httpx.Client(base_url=server.url, timeout=30) as client:
        context = client.post("/tokenize", json={"prompt": CONTEXT, "add_special_tokens": False}).json()["tokens"]
        whole = client.post("/tokenize", json={"prompt": CONTEXT + CONTINUATION,
                                               "add_special_tokens": False}).json()["tokens"]
        answer = client.post("/v1/completions", json={"prompt": whole, "max_tokens": 1, "echo": True,
                                                      "logprobs": 1, "temperature": 0}).json()
    assert whole[: len(context)] == context
    expected = sum(answer["choices"][0]["logprobs"]["token_logprobs"][len(context) : len(whole)])
    assert math.isfinite(logprob) and logprob < 0 and isinstance(is_greedy, bool)
    assert logprob == pytest.approx(expected, abs=1e-5)
