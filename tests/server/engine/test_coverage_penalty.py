"""Beam search with a coverage penalty (OpenNMT-py's `-coverage_penalty wu|summary -beta`) through a busy engine, for
a recurrent encoder-decoder (OpenNMT's, converted) and a Transformer one (Marian, as the hub ships it), applied to
finished hypotheses (OpenNMT's default) or at every step (-stepwise_penalty): the n best answers and their scores
equal a reference beam search whose every beam's coverage is recomputed from scratch by the reference models (the
equations' attention; transformers' cross-attention weights), beside requests without the penalty; under cache
pressure (beams preempted and recomputed) the answers stay the same; a model without attention refuses the
penalty."""

from __future__ import annotations

import pytest
import torch

from quill.models.classic.conversion import convert
from quill.models.loading.checkpoint import load_checkpoint
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.sampling import SamplingParams
from tests.conftest import TEST_DEVICE
from tests.models.test_rnn_seq2seq import reference, save, tiny_model
from tests.seq2seq_models import write_checkpoint
from tests.toolkit_reference import reference_beam, run_to_end

pytest.importorskip("transformers")


def penalty_from(kind: str, beta: float, attention_of):
    """prefix -> beta * the penalty of its coverage, the attention of every position of the prefix summed; written
    from the definitions (Wu et al. 2016; OpenNMT's summary penalty)."""
    def penalty(prefix: list[int]) -> float:
        coverage = attention_of(prefix).sum(0)
        if kind == "wu":
            return -beta * float(torch.log(torch.clamp(coverage, max=1.0)).sum())
        return beta * float((torch.clamp(coverage, min=1.0) - 1.0).sum())
    return penalty


@pytest.fixture(scope="module")
def opennmt(tmp_path_factory):
    directory = tmp_path_factory.mktemp("onmt")
    model = tiny_model(4, rnn_type="LSTM", bidirectional=True, global_attention="general", input_feed=True, layers=2)
    with torch.no_grad():  # answers of different lengths, so that hypotheses with different coverage compete
        model.generator_bias[3] += 2.0  # OpenNMT's </s>
    save(directory / "model.pt", model, "v3")
    loaded = load_checkpoint(convert(directory).save(directory / "quill"), device=str(TEST_DEVICE), dtype="float32")

    def functions(source):
        def attention_of(prefix):
            weights: list = []
            reference(model, source, prefix, weights)
            return torch.stack(weights)
        return (lambda prefix: reference(model, source, prefix)[-1]), attention_of

    sources = [[5, 9, 3, 7, 11, 4, 8, 6], [6, 12, 4], [13, 4, 21, 7, 9, 5, 14, 10, 3, 12, 8], [7]]
    return loaded, functions, sources


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    directory = tmp_path_factory.mktemp("marian")
    hf, _ = write_checkpoint(directory, "marian")
    with torch.no_grad():  # answers of different lengths, so that hypotheses with different coverage compete
        hf.final_logits_bias[0, hf.config.eos_token_id] += 6.0
    hf.save_pretrained(directory)
    hf.set_attn_implementation("eager")  # the one that returns its weights
    loaded = load_checkpoint(directory, device=str(TEST_DEVICE), dtype="float32")
    banned = loaded.banned_token_ids

    @torch.no_grad()
    def forward(source, prefix):
        out = hf(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([prefix]), use_cache=False,
                 output_attentions=True)
        logits = out.logits[0, -1].clone()
        logits[banned] = float("-inf")  # the checkpoint's bad words, banned in every row as Quill bans them
        return torch.log_softmax(logits, -1), out.cross_attentions[-1][0].mean(0)

    def functions(source):
        return (lambda prefix: forward(source, prefix)[0]), (lambda prefix: forward(source, prefix)[1])

    generator = torch.Generator().manual_seed(8)
    eos = loaded.eos_token_ids[0]
    sources = [torch.randint(5, 60, (n,), generator=generator).tolist() + [eos] for n in (9, 3, 14, 1)]
    return loaded, functions, sources


def _answers(case, kind: str, beta: float, core: EngineCore | None = None, stepwise: bool = False):
    """Each source with the penalty, and without it (plain beams) and greedy beside, in one engine -> (got,
    expected) of the penalised requests, and the plain beams' answers."""
    loaded, functions, sources = case
    width, n, max_tokens = 4, 3, 9
    beam = dict(max_tokens=max_tokens, temperature=0, use_beam_search=True, beam_width=width, n=n)
    requests = {}
    for i, source in enumerate(sources):
        requests[f"coverage{i}"] = (source, SamplingParams(**beam, coverage_penalty=beta, coverage_penalty_type=kind,
                                                           coverage_penalty_stepwise=stepwise))
        requests[f"plain{i}"] = (source, SamplingParams(**beam))
        requests[f"greedy{i}"] = (source, SamplingParams(max_tokens=max_tokens, temperature=0))
    got = run_to_end(core or EngineCore(loaded), requests)
    start, eos = loaded.model.config.decoder_start_token_id, loaded.eos_token_ids[0]
    expected = []
    for source in sources:
        next_logprobs, attention_of = functions(source)
        penalty = penalty_from(kind, beta, attention_of)
        expected.append(reference_beam(next_logprobs, start, max_tokens, eos, width, n, penalty=penalty,
                                       stepwise=stepwise))
    return [got[f"coverage{i}"] for i in range(len(sources))], expected, [got[f"plain{i}"] for i in range(len(sources))]


def _assert_equal(got, expected) -> None:
    for i, (g, e) in enumerate(zip(got, expected)):
        assert [tokens for tokens, _ in g] == [tokens for tokens, _ in e], f"source {i}"
        assert [score for _, score in g] == pytest.approx([score for _, score in e], abs=1e-4), f"source {i}"


@pytest.mark.parametrize("family", ["opennmt", "marian"])
@pytest.mark.parametrize("kind,beta,stepwise", [("wu", 0.8, False), ("summary", 1.5, False), ("wu", 0.8, True),
                                                ("summary", 1.5, True)])
def test_answers_and_scores_equal_the_reference(request, family, kind, beta, stepwise):
    got, expected, plain = _answers(request.getfixturevalue(family), kind, beta, stepwise=stepwise)
    _assert_equal(got, expected)
    # the penalty is felt: scores fall (a 1-token source is over-covered by any longer answer), and wu, which
    # favours answers that cover the source, picks longer ones than the plain beams somewhere
    assert got != plain
    if kind == "wu":
        assert any([t for t, _ in g] != [t for t, _ in p] for g, p in zip(got, plain))


@pytest.mark.parametrize("family", ["opennmt", "marian"])
def test_a_stepwise_penalty_steers_the_search_itself(request, family):
    """Ranked into every step, "wu" keeps other beams alive than when it only scores the finished ones: somewhere the
    n best differ."""
    case = request.getfixturevalue(family)
    finished_only, stepwise = _answers(case, "wu", 0.8)[0], _answers(case, "wu", 0.8, stepwise=True)[0]
    assert any([t for t, _ in a] != [t for t, _ in b] for a, b in zip(finished_only, stepwise))


def test_preempted_beams_sum_their_coverage_again_from_the_start(marian):
    """A cache too small for every beam at once: sequences are preempted and recomputed from their tokens, their
    coverage summed anew from position 0 (not added twice), and answer as the reference does."""
    core = EngineCore(marian[0], EngineConfig(cache=CacheConfig(block_size=4, num_blocks=16)))
    got, expected, _ = _answers(marian, "wu", 0.8, core)
    assert core.scheduler.num_preemptions > 0
    _assert_equal(got, expected)


def test_a_model_without_attention_refuses_the_penalty(tmp_path):
    model = tiny_model(5, global_attention="none")
    (tmp_path / "onmt").mkdir()
    save(tmp_path / "onmt" / "model.pt", model, "v3")
    saved = convert(tmp_path / "onmt").save(tmp_path / "quill")
    loaded = load_checkpoint(saved, device=str(TEST_DEVICE), dtype="float32")
    engine = EngineCore(loaded)
    params = SamplingParams(max_tokens=4, temperature=0, use_beam_search=True, beam_width=2, coverage_penalty=0.5)
    with pytest.raises(ValueError, match="coverage_penalty needs an encoder-decoder model whose decoder attends"):
        engine.add_request("r", [2], params, encoder_token_ids=[5, 6])
    assert not engine.has_work()


@pytest.mark.parametrize("settings,message", [
    (dict(coverage_penalty=0.5), "coverage_penalty needs use_beam_search"),
    (dict(coverage_penalty_type="summary"), "coverage_penalty_type needs use_beam_search"),
    (dict(use_beam_search=True, beam_width=2, coverage_penalty=-0.1), "coverage_penalty must be >= 0"),
    (dict(use_beam_search=True, beam_width=2, coverage_penalty_type="gnmt"), "must be one of wu, summary"),
    (dict(use_beam_search=True, beam_width=2, coverage_penalty_stepwise=True), "needs a coverage_penalty above 0"),
    (dict(use_beam_search=True, beam_width=2, coverage_penalty=0.5, coverage_penalty_stepwise="yes"),
     "must be a boolean"),
])
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(max_tokens=4, temperature=0, **settings)
