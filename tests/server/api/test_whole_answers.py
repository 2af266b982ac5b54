"""Answers that are not streamed are made from the request's merged output alone: however the engine's
deltas came (several steps, n completions interleaved, log-probabilities, prompt log-probabilities), the
answer is the one a single output holding all of them gets."""

from __future__ import annotations

import pytest

from quill.server.api.app import create_app
from quill.server.engine.process.frontend import RequestStream
from quill.server.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob, merge_outputs
from quill.server.hosting import ModelHost
from tests.server.api.conftest import server_config


@pytest.fixture(scope="module")
def app(tiny_checkpoints):
    """tiny-transformer answers completions and TGI; the bundled shakespeare model has a chat template."""
    config = server_config({"tiny": tiny_checkpoints["tiny-transformer"], "shakespeare": "shakespeare-transformer"})
    host = ModelHost.load(config)
    host.start()
    yield create_app(host, config)
    host.shutdown()


class ScriptedStream:
    """Stands in for the engine's RequestStream: plays back outputs one by one; `final` is the real one."""

    final = RequestStream.final

    def __init__(self, outputs: list[RequestOutput]):
        self.outputs, self.finished = outputs, False

    def __aiter__(self):
        return self._play()

    async def _play(self):
        for out in self.outputs:
            yield out

    def close(self):
        self.finished = True


def entry(token_id: int, logprob: float) -> TokenLogprob:
    return TokenLogprob(token_id, logprob, [(token_id, logprob), (token_id + 1, logprob - 1.0)])


def deltas(n: int) -> list[RequestOutput]:
    """Three steps of a request with `n` completions: tokens, log-probabilities and finish reasons spread out."""
    first = [CompletionOutput(i, "ab"[i], [65 + i], [entry(65 + i, -0.5)], None, -0.5) for i in range(n)]
    second = [CompletionOutput(0, "cd", [67, 68], [entry(67, -0.25), entry(68, -1.0)], None, -1.75)]
    last = [CompletionOutput(i, "e", [69], [entry(69, -0.125)], "length", -1.875 + i) for i in reversed(range(n))]
    return [RequestOutput("r", first, False, 3, prompt_logprobs=[None, entry(66, -2.0), entry(67, -3.0)],
                          queue_time=0.01),
            RequestOutput("r", second, False, 3),
            RequestOutput("r", last, True, 3)]


def without_ids(body):
    """An answer less what differs between any two requests."""
    if isinstance(body, list):
        return [without_ids(b) for b in body]
    return {k: v for k, v in body.items() if k not in ("id", "created")}


async def answer(client, app, monkeypatch, path: str, body: dict, outputs: list[RequestOutput]):
    engine = app.state.host.get(body.get("model")).engine
    monkeypatch.setattr(engine, "submit", lambda *a, **k: ScriptedStream(outputs))
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    return without_ids(r.json())


CASES = {
    "completions": ("/v1/completions", dict(model="tiny", prompt=[1, 2, 3], n=2, max_tokens=4, logprobs=1, echo=True), 2),
    "chat": ("/v1/chat/completions", dict(model="shakespeare", messages=[{"role": "user", "content": "Speak"}], n=2,
                                          max_tokens=4, logprobs=True, top_logprobs=1), 2),
    "tgi": ("/generate", dict(model="tiny", inputs="abc", parameters=dict(max_new_tokens=4, details=True,
                                                                          decoder_input_details=True,
                                                                          top_n_tokens=1)), 1),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_answer_is_that_of_the_merged_output(client, app, monkeypatch, case):
    path, body, n = CASES[case]
    steps = deltas(n)
    whole = await answer(client, app, monkeypatch, path, body, steps)
    assert whole == await answer(client, app, monkeypatch, path, body, [merge_outputs(steps)])
    assert whole == await answer(client, app, monkeypatch, path, body, [merge_outputs(steps[:2]), steps[2]])
