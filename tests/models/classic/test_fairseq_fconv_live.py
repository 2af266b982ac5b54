"""A converted fconv_lm, saved as a Quill checkpoint, served by the real server to the openai client."""

from __future__ import annotations

import openai
import pytest
import torch

from quill.models.loading.checkpoint import save_checkpoint
from quill.models.classic import fairseq_fconv
from tests.conftest import LiveServer
from tests.models.classic.fairseq_fconv_reference import write_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm. is deprecated:FutureWarning")

PROMPT = "w1 w5 w30\nw11 unheard"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(reference model, tokenizer, openai client) over a server of the converted checkpoint."""
    root = tmp_path_factory.mktemp("fconv-live")
    reference = write_checkpoint(root / "fairseq")
    converted = fairseq_fconv.convert(root / "fairseq", None)
    path = save_checkpoint(root / "quill", converted.architecture, converted.model, converted.tokenizer,
                           dtype=torch.float32, metadata=converted.metadata)
    with LiveServer({"fconv": str(path)}) as server:
        yield reference, converted.tokenizer, openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")


def reference_greedy(reference, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    ids, logprobs = list(ids), []
    for _ in range(n):
        row = reference.log_probs(ids)[-1]
        ids.append(int(row.argmax()))
        logprobs.append(row.max().item())
    return ids[-n:], logprobs


def test_greedy_completion_and_its_logprobs_are_the_references(served):
    reference, tokenizer, client = served
    want_ids, want_logprobs = reference_greedy(reference, tokenizer.encode(PROMPT), 8)
    done = client.completions.create(model="fconv", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=1,
                                     extra_body={"ignore_eos": True})
    choice = done.choices[0]
    assert choice.text == tokenizer.decode_continuation(tokenizer.encode(PROMPT), want_ids)
    assert choice.logprobs.token_logprobs == pytest.approx(want_logprobs, abs=1e-4)


def test_streamed_text_is_the_whole_text(served):
    _, _, client = served
    options = dict(model="fconv", prompt=PROMPT, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**options).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **options) if c.choices)
    assert streamed == whole and len(whole.split()) == 10


def test_beam_search_answers_the_best_beams(served):
    _, _, client = served
    beams = client.completions.create(model="fconv", prompt=PROMPT, max_tokens=4, n=2, best_of=3,
                                      extra_body={"use_beam_search": True, "ignore_eos": True})
    assert len(beams.choices) == 2 and beams.choices[0].text != beams.choices[1].text
