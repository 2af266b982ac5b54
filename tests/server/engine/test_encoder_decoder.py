"""Encoder-decoder requests through the engine, in busy continuous batches, against transformers' `generate()`:
greedy, beam search with n-best lists and scores, length penalty and no_repeat_ngram_size, a forced target-language
token; one encoder output per source, shared by every beam and freed with its request."""

from __future__ import annotations

import pytest
import torch

from quill.models.loading.checkpoint import LoadedModel
from quill.models.text.tokenizer import Tokenizer
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.outputs import merge_outputs
from quill.server.sampling import SamplingParams
from tests.conftest import TEST_DEVICE
from tests.server.engine.test_graphs import graph_capture, record_replays
from tests.seq2seq_models import VOCAB, load_quill_model, write_hf_model
from tests.tiny_tokenizers import build_hf_tokenizer

pytest.importorskip("transformers")

EOS = 2


def _engine(directory, family: str, banned: list[int] = (), bad_words: list[list[int]] = (),
            forced_eos: list[int] = (), graphs: bool | None = None, **cache) -> tuple[EngineCore, object]:
    """`graphs`: decode steps replayed as graphs (True: CUDA's, emulated on a CPU), eager (False), or the
    device's default (None: graphs on CUDA)."""
    reference = write_hf_model(directory, family)
    model = load_quill_model(directory, TEST_DEVICE)
    eos = reference.config.eos_token_id
    loaded = LoadedModel(name=family, path=directory, architecture="seq2seq", model=model,
                         tokenizer=Tokenizer(build_hf_tokenizer(VOCAB), eos), eos_token_ids=[eos],
                         device=TEST_DEVICE, dtype=torch.float32, banned_token_ids=list(banned),
                         bad_words_ids=list(bad_words), forced_eos_token_ids=list(forced_eos))
    if "cache_bytes" not in cache:  # not the default, 90% of a GPU, which parallel test workers share
        cache.setdefault("num_blocks", 512)
    config = EngineConfig(cache=CacheConfig(**cache), enforce_eager=graphs is False)
    return EngineCore(loaded, config, graph_capture=graph_capture(TEST_DEVICE) if graphs else None), reference


def _run(engine: EngineCore, later: dict[int, list[tuple]] | None = None) -> dict:
    """Every request to its end: request id -> {output index: (token ids, cumulative log-prob, score)}. `later`:
    step number -> add_request arguments of requests that arrive before it."""
    tokens, finals, later, steps = {}, {}, dict(later or {}), 0
    while engine.has_work() or later:
        for args in later.pop(steps, []):
            engine.add_request(*args[:3], encoder_token_ids=args[3])
        steps += 1
        for out in engine.step():
            assert out.error is None
            for o in out.outputs:
                tokens.setdefault((out.request_id, o.index), []).extend(o.token_ids)
                if out.finished:
                    finals.setdefault(out.request_id, {})[o.index] = (tokens[out.request_id, o.index],
                                                                      o.cumulative_logprob, o.score)
    return finals


def _sources(count: int, seed: int = 3) -> list[list[int]]:
    torch.manual_seed(seed)
    # ids within every family's source vocabulary (FSMT's is the smaller by 20)
    return [torch.randint(3, VOCAB - 20, (n,)).tolist() + [EOS] for n in torch.randint(2, 20, (count,)).tolist()]


def _generated(reference, source, start, **kwargs):
    # forced_eos_token_id off unless asked for: the checkpoints' configs (FSMT's) would force EOS at the length limit
    kwargs.setdefault("forced_eos_token_id", None)
    out = reference.generate(torch.tensor([source]), do_sample=False, return_dict_in_generate=True,
                             output_scores=True, **kwargs)
    eos = reference.config.eos_token_id
    rows = [row[1:].tolist() for row in out.sequences]
    rows = [row[: row.index(eos) + 1] if eos in row else row for row in rows]  # shorter rows are padded after EOS
    return rows, (out.sequences_scores.tolist() if kwargs.get("num_beams", 1) > 1 else None)


@pytest.mark.parametrize("family", ["marian", "m2m_100", "fsmt", "t5-gated", "umt5"])
def test_busy_batch_equals_transformers(tmp_path, family):
    engine, reference = _engine(tmp_path, family)
    start = reference.config.decoder_start_token_id
    sources = _sources(5)
    kinds = {
        "greedy": (SamplingParams(max_tokens=12, temperature=0), dict(num_beams=1)),
        "ngram": (SamplingParams(max_tokens=12, temperature=0, no_repeat_ngram_size=2),
                  dict(num_beams=1, no_repeat_ngram_size=2)),
        "beam": (SamplingParams(max_tokens=12, temperature=0, use_beam_search=True, beam_width=4, n=3,
                                length_penalty=0.7, no_repeat_ngram_size=2),
                 dict(num_beams=4, num_return_sequences=3, length_penalty=0.7, no_repeat_ngram_size=2)),
    }
    for i, source in enumerate(sources):  # all at once: encoder passes packed, steps mixing prompts and decodes
        for kind, (params, _) in kinds.items():
            engine.add_request(f"{kind}{i}", [start], params, encoder_token_ids=source)
    finals = _run(engine)
    for i, source in enumerate(sources):
        for kind, (_, hf_kwargs) in kinds.items():
            expected, scores = _generated(reference, source, start, max_new_tokens=12, **hf_kwargs)
            got = finals[f"{kind}{i}"]
            assert [got[j][0] for j in range(len(expected))] == expected, (kind, i)
            if scores is not None:  # n-best with their length-penalised scores
                assert [got[j][2] for j in range(len(scores))] == pytest.approx(scores, abs=1e-4)


@pytest.mark.parametrize("family", ["marian", "t5-gated", "m2m_100"])
def test_decode_steps_replayed_as_graphs_equal_eager_steps(tmp_path, family):
    """Encoder-decoder decode steps are captured as graphs as the decoder-only models' are (the cross-attention's
    blocks and source lengths read from the table's rows in the bucket's buffers): greedy, seeded sampling and beam
    answers equal eager steps', beside requests still encoding (on a GPU through the Triton kernel, which reads
    the encoder's blocks in place; its interpreter on a CPU takes minutes for this, so test_seq2seq.py checks that
    kernel's cross-attention there)."""
    answers, replayed = {}, None
    for graphs in (False, True):
        engine, reference = _engine(tmp_path / str(graphs), family, graphs=graphs, block_size=4)
        seen = record_replays(engine) if graphs else None
        start = reference.config.decoder_start_token_id
        kinds = [SamplingParams(max_tokens=10, temperature=0),
                 SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, seed=5),
                 SamplingParams(max_tokens=8, temperature=0, use_beam_search=True, beam_width=3, n=2)]
        arrivals = {}
        for i, source in enumerate(_sources(6)):  # the last three arrive while the first three decode
            arrivals.setdefault(0 if i < 3 else 2, []).append((f"r{i}", [start], kinds[i % 3], source))
        answers[graphs], replayed = _run(engine, arrivals), seen
    assert replayed and any(real < size for real, size in replayed)  # replays, padding rows among them
    for request, outs in answers[False].items():
        for index, (tokens, logprob, score) in outs.items():
            got = answers[True][request][index]
            assert got[0] == tokens, (request, index)
            assert got[1] == pytest.approx(logprob, abs=1e-4)


def test_forced_first_token_equals_forced_bos(tmp_path):
    """M2M100 and NLLB name the target language by forcing it as the first output token."""
    engine, reference = _engine(tmp_path, "m2m_100")
    language = 77
    sources = _sources(3, seed=5)
    for i, source in enumerate(sources):
        engine.add_request(f"g{i}", [2], SamplingParams(max_tokens=10, temperature=0), encoder_token_ids=source,
                           forced_token_ids=[language])
        engine.add_request(f"b{i}", [2], SamplingParams(max_tokens=10, temperature=0, use_beam_search=True,
                                                        beam_width=3, n=2), encoder_token_ids=source,
                           forced_token_ids=[language])
    finals = _run(engine)
    for i, source in enumerate(sources):
        greedy, _ = _generated(reference, source, 2, max_new_tokens=10, forced_bos_token_id=language)
        assert finals[f"g{i}"][0][0] == greedy[0]
        beams, scores = _generated(reference, source, 2, max_new_tokens=10, forced_bos_token_id=language,
                                   num_beams=3, num_return_sequences=2)
        assert [finals[f"b{i}"][j][0] for j in range(2)] == beams
        assert [finals[f"b{i}"][j][2] for j in range(2)] == pytest.approx(scores, abs=1e-4)


def _greedy_answers(directory, family: str, sources: list[list[int]], max_tokens: int) -> list[list[int]]:
    free, reference = _engine(directory, family)
    for i, source in enumerate(sources):
        free.add_request(f"g{i}", [reference.config.decoder_start_token_id],
                         SamplingParams(max_tokens=max_tokens, temperature=0), encoder_token_ids=source)
    finals = _run(free)
    return [finals[f"g{i}"][0][0] for i in range(len(sources))]


def test_banned_tokens_are_never_generated_as_bad_words_ids_makes_generate(tmp_path):
    """A checkpoint's one-token bad words (Marian bans its pad token so): banned here at the greedy answers' own
    favourite tokens, so that the ban changes them; greedy and beam answers equal `generate(bad_words_ids=...)`,
    beam scores too (ranked, as there, by the log-softmax of the whole distribution, the banned tokens then -inf)."""
    sources = _sources(3, seed=7)
    favourites = sorted({answer[0] for answer in _greedy_answers(tmp_path / "free", "marian", sources, 8)})
    engine, reference = _engine(tmp_path / "banned", "marian", banned=favourites)
    start = reference.config.decoder_start_token_id
    for i, source in enumerate(sources):
        engine.add_request(f"g{i}", [start], SamplingParams(max_tokens=8, temperature=0), encoder_token_ids=source)
        engine.add_request(f"b{i}", [start], SamplingParams(max_tokens=8, temperature=0, use_beam_search=True,
                                                        beam_width=3, n=2), encoder_token_ids=source)
    finals = _run(engine)
    bad_words = [[t] for t in favourites]
    for i, source in enumerate(sources):
        greedy, _ = _generated(reference, source, 2, max_new_tokens=8, bad_words_ids=bad_words, num_beams=1)
        assert finals[f"g{i}"][0][0] == greedy[0] and not set(greedy[0]) & set(favourites)
        beams, scores = _generated(reference, source, 2, max_new_tokens=8, bad_words_ids=bad_words, num_beams=3,
                                   num_return_sequences=2)
        assert [finals[f"b{i}"][j][0] for j in range(2)] == beams
        assert [finals[f"b{i}"][j][2] for j in range(2)] == pytest.approx(scores, abs=1e-4)


def test_longer_bad_words_equal_generate(tmp_path):
    """A checkpoint's bad words of two tokens, each the first two tokens of a greedy answer: the second is banned
    only right after the first. Greedy and beam answers, with their scores, equal `generate(bad_words_ids=...)`;
    a request's own bad words (SamplingParams.bad_words_token_ids) count beside the checkpoint's."""
    sources = _sources(3, seed=11)
    answers = _greedy_answers(tmp_path / "free", "marian", sources, 8)
    checkpoint_words = [answers[0][:2], answers[1][:2]]
    own = [answers[2][:2]]
    engine, reference = _engine(tmp_path / "banned", "marian", bad_words=checkpoint_words)
    start = reference.config.decoder_start_token_id
    for i, source in enumerate(sources):
        engine.add_request(f"g{i}", [start], SamplingParams(max_tokens=8, temperature=0, bad_words_token_ids=own),
                           encoder_token_ids=source)
        engine.add_request(f"b{i}", [start], SamplingParams(max_tokens=8, temperature=0, use_beam_search=True,
                                                        beam_width=3, n=2, bad_words_token_ids=own),
                           encoder_token_ids=source)
    finals = _run(engine)
    words = own + checkpoint_words
    for i, source in enumerate(sources):
        greedy, _ = _generated(reference, source, 2, max_new_tokens=8, bad_words_ids=words, num_beams=1)
        assert finals[f"g{i}"][0][0] == greedy[0] != answers[i]
        beams, scores = _generated(reference, source, 2, max_new_tokens=8, bad_words_ids=words, num_beams=3,
                                   num_return_sequences=2)
        assert [finals[f"b{i}"][j][0] for j in range(2)] == beams
        assert [finals[f"b{i}"][j][2] for j in range(2)] == pytest.approx(scores, abs=1e-4)


@pytest.mark.parametrize("family", ["marian", "fsmt"])
def test_forced_eos_at_the_limit_equals_generate(tmp_path, family):
    """forced_eos_token_id (Marian's, BART's, FSMT's configs): the last token max_tokens allows is EOS, greedy
    and beam, as `generate()` forces it; the answer still says it was cut by the length."""
    sources = _sources(4, seed=13)
    engine, reference = _engine(tmp_path, family, forced_eos=[EOS])
    start = reference.config.decoder_start_token_id
    beam = dict(temperature=0, use_beam_search=True, beam_width=4, n=3, length_penalty=0.8)
    for i, source in enumerate(sources):
        engine.add_request(f"g{i}", [start], SamplingParams(max_tokens=7, temperature=0, logprobs=1),
                           encoder_token_ids=source)
        engine.add_request(f"b{i}", [start], SamplingParams(max_tokens=7, **beam), encoder_token_ids=source)
    deltas = {}
    while engine.has_work():
        for out in engine.step():
            deltas.setdefault(out.request_id, []).append(out)
    outputs = {request: merge_outputs(outs) for request, outs in deltas.items()}
    for i, source in enumerate(sources):
        greedy, _ = _generated(reference, source, 2, max_new_tokens=7, forced_eos_token_id=EOS, num_beams=1)
        got = outputs[f"g{i}"].outputs[0]
        assert got.token_ids == greedy[0] and len(greedy[0]) == 7 and greedy[0][-1] == EOS
        assert got.finish_reason == "length" and got.logprobs[-1].logprob == 0.0
        beams, scores = _generated(reference, source, 2, max_new_tokens=7, forced_eos_token_id=EOS, num_beams=4,
                                   num_return_sequences=3, length_penalty=0.8)
        answer = outputs[f"b{i}"].outputs
        assert [o.token_ids for o in answer] == beams
        assert [o.score for o in answer] == pytest.approx(scores, abs=1e-4)
        assert all(o.finish_reason == "length" for o in answer if o.token_ids[-1] == EOS and len(o.token_ids) == 7)


def _encoder_blocks_held(engine: EngineCore, params: SamplingParams, source: list[int]) -> int:
    engine.add_request("r", [1], params, encoder_token_ids=source)
    encoder = engine.cache.encoder
    most = 0
    while engine.has_work():
        engine.step()
        most = max(most, sum(len(e.blocks) for e in encoder.entries.values() if e.holders))
    return most


def test_beams_share_one_encoder_output(tmp_path):
    engine, _ = _engine(tmp_path, "marian", block_size=4)
    source = _sources(1)[0] + [5] * 20
    greedy = _encoder_blocks_held(engine, SamplingParams(max_tokens=8, temperature=0), source)
    engine.cache.encoder.reset()
    beams = _encoder_blocks_held(engine, SamplingParams(max_tokens=8, temperature=0, use_beam_search=True,
                                                        beam_width=5, n=5), source)
    assert greedy == -(-len(source) // 4)
    assert beams <= 1.1 * greedy


def test_a_source_is_encoded_once(tmp_path):
    """One document to many targets: later requests with the same source reuse its encoder output."""
    engine, _ = _engine(tmp_path, "m2m_100")
    encodes = []
    encode = engine.runner.model.encode
    engine.runner.model.encode = lambda sources, tables, state: (encodes.append(len(sources)),
                                                                encode(sources, tables, state))
    source = _sources(1)[0]
    for i, language in enumerate((70, 71, 72)):
        engine.add_request(f"r{i}", [2], SamplingParams(max_tokens=4, temperature=0), encoder_token_ids=source,
                           forced_token_ids=[language])
    _run(engine)
    engine.add_request("later", [2], SamplingParams(max_tokens=4, temperature=0), encoder_token_ids=source)
    _run(engine)
    assert encodes == [1]
    assert engine.cache.encoder.hits == 3


def test_abort_frees_the_encoder_output(tmp_path):
    engine, _ = _engine(tmp_path, "marian", num_blocks=8, block_size=4)
    encoder = engine.cache.encoder
    engine.add_request("a", [1], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True),
                       encoder_token_ids=_sources(1)[0])
    engine.step()
    engine.step()
    assert encoder.usage > 0
    assert engine.abort("a")
    assert encoder.usage == 0 and not encoder.entry_of
    # its blocks serve other sources: every other request fits and finishes
    for i, source in enumerate(_sources(4, seed=9)):
        engine.add_request(f"b{i}", [1], SamplingParams(max_tokens=3, temperature=0), encoder_token_ids=source)
    assert len(_run(engine)) == 4


def test_seeded_samples_do_not_depend_on_the_batch(tmp_path):
    engine, _ = _engine(tmp_path, "marian")
    source = _sources(1)[0]
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=11, n=2)
    engine.add_request("alone", [1], params, encoder_token_ids=source)
    alone = _run(engine)["alone"]
    for i, other in enumerate(_sources(6, seed=4)):
        engine.add_request(f"o{i}", [1], SamplingParams(max_tokens=10, temperature=0.8, seed=i),
                           encoder_token_ids=other)
    engine.add_request("busy", [1], params, encoder_token_ids=source)
    busy = _run(engine)["busy"]
    assert [busy[j][0] for j in range(2)] == [alone[j][0] for j in range(2)]
    assert alone[0][0] != alone[1][0]  # two samples, two streams


def test_preempted_requests_answer_as_without_pressure(tmp_path):
    """A cache too small for every request at once: requests are preempted (their decoder blocks freed, their
    encoder outputs let go) and readmitted, and every answer equals the one given with room to spare."""
    sources = _sources(8, seed=21)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    answers = []
    for blocks in (None, 14):
        engine, _ = _engine(tmp_path / str(blocks), "marian", block_size=4, num_blocks=blocks)
        for i, source in enumerate(sources):
            engine.add_request(f"r{i}", [1], params, encoder_token_ids=source)
        answers.append({rid: out[0][0] for rid, out in _run(engine).items()})
        if blocks is not None:
            assert engine.scheduler.num_preemptions > 0
            assert engine.cache.encoder.usage == 0 and engine.cache.decoder.usage == 0
    assert answers[0] == answers[1]


def test_forced_eos_never_ends_a_sequence_before_its_first_step(tmp_path):
    """A target language forced as the first token, with max_tokens 2: the one token left is generated (no EOS
    forced at admission, when the sequence has not been scheduled yet); with 3, the third is the forced EOS."""
    engine, _ = _engine(tmp_path, "m2m_100", forced_eos=[EOS])
    sources = _sources(2, seed=5)
    for max_tokens, source in zip((2, 3), sources):
        engine.add_request(f"r{max_tokens}", [2], SamplingParams(max_tokens=max_tokens, temperature=0),
                           encoder_token_ids=source, forced_token_ids=[77])
    finals = _run(engine)
    short, longer = finals["r2"][0][0], finals["r3"][0][0]
    assert len(short) == 2 and short[0] == 77 and short[1] != EOS
    assert len(longer) == 3 and longer[0] == 77 and longer[2] == EOS
