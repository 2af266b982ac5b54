"""seq2seq_bench on a tiny Marian, in seconds: transformers and CTranslate2 offline and online, Quill over HTTP
(or its refusal), and what the comparisons rest on (same lengths, same greedy tokens). Structure, never speed."""

from __future__ import annotations

import json
import math
import shutil
from contextlib import ExitStack

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from benchmarks.common import seq2seq_http as qh
from benchmarks.common.marian_shape import TINY, Vocab, ensure_marian, random_sources
from benchmarks.common.seq2seq_report import online_budget
from benchmarks.common.seq2seq_runs import throughput_within
from benchmarks.seq2seq_bench import SMOKE, main

NO_CT2 = "ctranslate2 is not installed (import ctranslate2 failed): its paths cannot run"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the module: the tiny Marian (and its conversion) is built once."""
    return tmp_path_factory.mktemp("seq2seq-cache")


def _smoke(cache, tmp_path, *extra: str) -> dict:
    out = tmp_path / "seq2seq.json"
    results = main(["--smoke", "--threads", "1", "--cache-dir", str(cache), "--out", str(out), *extra])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    return results


def test_the_checkpoint_maps_every_id_and_the_sources_are_marian_sentences(cache):
    directory = ensure_marian(cache, TINY)
    assert ensure_marian(cache, TINY) == directory  # cached: built once
    vocab = Vocab.read(directory)
    assert len(vocab.pieces) == TINY.vocab_size and all(vocab.pieces)
    assert vocab.pieces[0] == "</s>" and vocab.pieces[1] == "<unk>" and vocab.pieces[-1] == "<pad>"
    assert len(vocab.real) > 500  # trained pieces, then filler
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert type(tokenizer).__name__ == "MarianTokenizer" and tokenizer.pad_token_id == TINY.vocab_size - 1
    assert tokenizer("Sedoyu mungnoca.").input_ids[-1] == 0  # it ends a sentence with </s>, as the sources do
    sources = random_sources(vocab, 50, (8, 64), seed=0)
    assert sources == random_sources(vocab, 50, (8, 64), seed=0)
    assert all(8 <= len(s) <= 64 and s[-1] == 0 and all(i in vocab.real for i in s[:-1]) for s in sources)


def test_transformers_and_ctranslate2_give_the_same_counts_and_the_same_greedy_tokens(cache, tmp_path, capsys):
    pytest.importorskip("ctranslate2", reason=NO_CT2)
    results = _smoke(cache, tmp_path, "--engines", "transformers,ctranslate2")
    expected = SMOKE.sources * SMOKE.new_tokens
    assert results["workload"]["generated_tokens_per_run"] == expected
    for beams in (1, 4):
        hf, ct = results["offline"]["transformers"][beams], results["offline"]["ctranslate2"][beams]
        assert hf["generated_tokens"] == ct["generated_tokens"] == expected  # each run also checked every length
        assert hf["tokens_per_s"] > 0 and ct["sentences_per_s"] > 0
    # float32 on the same weights: every greedy token the same
    assert results["agreement"][1]["ctranslate2_vs_transformers"] == {"same": SMOKE.sources, "of": SMOKE.sources}
    # beam 4 is only recorded: while the end token is barred (and <pad>, which CTranslate2 drops from its vocabulary),
    # CTranslate2 scores beams with log-probabilities renormalized over the tokens left, transformers with the full
    # softmax's; a beam search of either kind, written out, gives each engine's output exactly, and the two keep
    # different beams for 3 of 64 sources on the tiny model (none of 256 on OPUS-MT's shape)
    assert results["agreement"][4]["ctranslate2_vs_transformers"]["of"] == SMOKE.sources
    assert results["quill"] == {"ran": False, "refused": False, "reason": "not asked for (--engines)"}
    table = capsys.readouterr().out
    assert "CTranslate2 / transformers" in table and "same output, ctranslate2 vs transformers: 6 of 6" in table


def test_ctranslate2_counts_lengths_as_transformers_does(cache, tmp_path):
    """With the end token made the likeliest at every step, both stop right after their minimum length: the minimum
    counts tokens before the end token; at min == max neither returns an end token."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason=NO_CT2)
    import torch
    from transformers import MarianMTModel

    directory = tmp_path / "eos-first"
    shutil.copytree(ensure_marian(cache, TINY), directory)
    model = MarianMTModel.from_pretrained(directory).eval()
    with torch.no_grad():
        model.final_logits_bias[0, 0] = 1000.0  # </s>
    model.save_pretrained(directory)
    ctranslate2.converters.TransformersConverter(str(directory)).convert(str(tmp_path / "ct2"), quantization="float32")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    vocab = Vocab.read(directory)
    source = random_sources(vocab, 1, (12, 12), seed=0)[0]

    def ct2(low, high, end=True):
        result = translator.translate_batch([vocab.to_pieces(source)], beam_size=1, min_decoding_length=low,
                                            max_decoding_length=high, return_end_token=end)
        return result[0].hypotheses[0]

    with torch.inference_mode():
        hf = model.generate(torch.tensor([source]), min_new_tokens=3, max_new_tokens=10, num_beams=1)[0, 1:].tolist()
    assert len(hf) == 4 and hf[-1] == 0  # 3 tokens, then </s>
    assert vocab.to_ids(ct2(3, 10)) == hf
    assert ct2(3, 10, end=False) == ct2(3, 10)[:-1]
    assert len(ct2(5, 5)) == 5 and "</s>" not in ct2(5, 5)  # min == max: exactly that many, no end token


def test_online_ctranslate2_serves_every_request_through_the_micro_batcher(cache, tmp_path, capsys):
    pytest.importorskip("ctranslate2", reason=NO_CT2)
    results = _smoke(cache, tmp_path, "--engines", "ctranslate2", "--beams", "1", "--online")
    online = results["online"]
    assert online["rates"] == list(SMOKE.rates) and online["runs"]["quill"] == []
    for run, rate in zip(online["runs"]["ctranslate2"], SMOKE.rates):
        assert run["rate"] == rate and run["finished"] == run["requests"] >= 4
        assert 1 <= run["mean_batch"] <= SMOKE.batch_size and 0 < run["p50_s"] <= run["p99_s"] < math.inf
    assert online["budget_s"] > 0 and online["at_budget"]["ctranslate2"]["sentences_per_s"] > 0
    assert "Online: greedy, Poisson arrivals" in capsys.readouterr().out


def test_quill_serves_the_checkpoint_or_says_why_not(cache, tmp_path, capsys):
    results = _smoke(cache, tmp_path, "--engines", "transformers,quill")
    quill = results["quill"]
    if not quill["ran"]:  # encoder-decoders not served by this Quill: its reason, and no figures of its own
        said = "REFUSED the checkpoint" if quill["refused"] else "did not run"
        assert quill["reason"] and f"Quill {said}: {quill['reason']}" in capsys.readouterr().out
        assert all("error" in f for f in results["offline"]["quill"].values())
        return
    expected = SMOKE.sources * SMOKE.new_tokens
    for beams in (1, 4):
        assert results["offline"]["quill"][beams]["generated_tokens"] == expected  # usage.completion_tokens
        assert results["offline"]["transformers"][beams]["generated_tokens"] == expected
    assert results["agreement"][1]["quill_text_vs_transformers"]["of"] == SMOKE.sources
    assert "Quill / transformers" in capsys.readouterr().out


def test_a_checkpoint_quill_refuses_is_reported_in_its_words(cache, tmp_path):
    directory = tmp_path / "unknown-type"
    shutil.copytree(ensure_marian(cache, TINY), directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"model_type": "no-such-model"}))
    with ExitStack() as stack, pytest.raises(qh.QuillUnavailable) as refusal:
        qh.start_quill(stack, directory, "marian", 1, 8, 2**20, [], 120.0, lambda message: None)
    assert refusal.value.refused and "no-such-model" in refusal.value.reason


def test_a_start_failure_is_cut_to_the_servers_error_lines():
    message = ("stopped before http://127.0.0.1:1/ready answered 200; its output:\nINFO:     Started server process\n"
               "2026-11-27 23:45:22,142 ERROR quill.server: cannot load models: /m/tokenizer.json: missing file\n"
               "INFO:     Shutting down\n")
    failure = qh.start_failure(message)
    assert failure.refused and failure.reason == "cannot load models: /m/tokenizer.json: missing file"
    other = qh.start_failure("x did not answer 200 within 5 s")
    assert not other.refused and other.reason == "x did not answer 200 within 5 s"


def _run(rate, tput, p99, finished=10):
    return {"rate": rate, "sentences_per_s": tput, "p99_s": p99, "finished": finished, "requests": 10}


def test_throughput_at_the_budget_is_read_off_the_sweep():
    sweep = [_run(1, 1.0, 0.5), _run(2, 2.0, 1.0), _run(4, 3.0, 3.0)]
    assert throughput_within(sweep, 2.0) == (2.5, "")  # halfway from p99 1.0 to 3.0
    assert throughput_within(sweep, 0.4) == (0.0, "below the sweep")
    assert throughput_within(sweep, 5.0) == (3.0, "at least")
    assert throughput_within([_run(1, 1.0, 0.5), _run(2, 1.5, math.inf, finished=8)], 1.0) == (1.0, "")
    ct2 = [_run(1, 1.0, 0.5), _run(2, 1.9, 0.8), _run(4, 2.5, 9.0)]  # kept up to 2/s: the budget is 0.8 s
    quill = [_run(1, 1.0, 0.2), _run(2, 2.0, 0.4), _run(4, 4.0, 0.6)]
    budget = online_budget(ct2, quill)
    assert budget["budget_s"] == 0.8 and budget["budget_rate"] == 2
    assert budget["at_budget"]["quill"] == {"sentences_per_s": 4.0, "how": "at least"}
    assert budget["ratio"] == pytest.approx(4.0 / 1.9)
