"""`quill bench` against a real server on tiny models: the JSON and the plots, and an encoder-decoder (translation)
model's requests with their languages. No performance asserts."""

from __future__ import annotations

import json
import random

import pytest

from quill.clients.bench.context_sweep import verdict
from quill.clients.bench.report import distribution, percentile
from quill.clients.bench.target import require_loopback
from quill.clients.bench.workload import (SOURCE_MARKERS, TargetModel, WorkloadSpec, build_requests, parse_mix,
                                          parse_range)
from quill.clients.request import completion_body
from quill.cli import main
from tests.conftest import LiveServer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Tiny everything: the tiny transformer's context is 64 tokens and its tokenizer splits words finely.
SMALL = ["--prompt-len", "4:12", "--max-tokens", "3:8", "--warmup", "1", "--no-progress"]


def bench(tmp_path, url: str, *flags: str) -> tuple[int, dict]:
    out = tmp_path / "bench.json"
    code = main(["bench", "--url", url, "--out", str(out), *SMALL, *flags])
    return code, json.loads(out.read_text())


# ---- unit: no server ---------------------------------------------------------------

def test_percentiles_on_a_known_sample():
    sample = [float(v) for v in range(1, 101)]  # 1..100
    random.Random(0).shuffle(sample)
    assert percentile(sample, 50) == pytest.approx(50.5)
    assert percentile(sample, 90) == pytest.approx(90.1)
    assert percentile(sample, 99) == pytest.approx(99.01)
    assert percentile(sample, 0) == 1.0 and percentile(sample, 100) == 100.0
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) is None
    d = distribution([0.1, 0.2, 0.3, 0.4])
    assert d["count"] == 4 and d["mean"] == pytest.approx(0.25) and d["p50"] == pytest.approx(0.25)
    assert d["p90"] == pytest.approx(0.37)


def test_mix_and_ranges_parse():
    mix = dict((s.name, w) for s, w in parse_mix("greedy=0.4,top_p=0.3,beam=0.1,n2=0.2"))
    assert mix == pytest.approx({"greedy": 0.4, "top_p": 0.3, "beam": 0.1, "n2": 0.2})
    assert dict((s.name, s.options["n"]) for s, _ in parse_mix("n3")) == {"n3": 3}
    assert parse_range("64", "x") == (64, 64) and parse_range("32:128", "x") == (32, 128)
    for bad in ("0", "9:3", "a:b"):
        with pytest.raises(ValueError):
            parse_range(bad, "x")
    with pytest.raises(ValueError):
        parse_mix("nucleus=1")


def test_workload_is_reproducible_and_fits_the_context():
    spec = WorkloadSpec(num_requests=50, prompt_len=(10, 60), max_tokens=(5, 40), models=["a", "b"], rate=4.0, seed=3)
    targets = {"a": TargetModel(64, tokens_per_word=1.0), "b": TargetModel(4096, tokens_per_word=2.0)}
    one = build_requests(spec, targets)
    two = build_requests(spec, targets)
    assert [(r.prompt, r.max_tokens, r.send_at) for r in one] == [(r.prompt, r.max_tokens, r.send_at) for r in two]
    assert [r.model for r in one[:4]] == ["a", "b", "a", "b"]
    assert all(isinstance(r.prompt, str) for r in one)
    assert all(r.target_prompt_tokens + r.max_tokens <= 64 for r in one if r.model == "a")
    assert all(b.send_at >= a.send_at for a, b in zip(one, one[1:])) and one[-1].send_at > 0
    assert build_requests(spec, targets, salt=1)[0].prompt != one[0].prompt  # warm-ups draw other prompts


def test_token_id_prompts_have_exact_lengths_inside_the_vocabulary():
    spec = WorkloadSpec(num_requests=64, prompt_len=(32, 128), max_tokens=(16, 128), models=["m"], prompts="ids")
    requests = build_requests(spec, {"m": TargetModel(1024, vocab_size=1000)})
    assert all(len(r.prompt) == r.target_prompt_tokens and 32 <= len(r.prompt) <= 128 for r in requests)
    assert all(0 < t < 1000 for r in requests for t in r.prompt)  # id 0 (EOS) is never drawn
    assert all(16 <= r.max_tokens <= 128 and r.strategy.name == "greedy" for r in requests)
    assert len({tuple(r.prompt[:4]) for r in requests}) == 64  # no shared prefixes
    with pytest.raises(ValueError, match="vocab_size"):
        build_requests(spec, {"m": TargetModel(1024)})
    with pytest.raises(ValueError, match="prompts"):
        WorkloadSpec(prompts="bytes")


def test_an_encoder_decoder_gets_its_languages_in_turn_and_a_source_that_fits_its_encoder():
    spec = WorkloadSpec(num_requests=40, prompt_len=(10, 60), max_tokens=(5, 80), models=["mt", "lm"], seed=2)
    mt = TargetModel(64, encoder_decoder=True, max_source_len=24, source_lang="en", target_langs=("fr", "de", "es"))
    requests = build_requests(spec, {"mt": mt, "lm": TargetModel(64)})
    translations = [r for r in requests if r.model == "mt"]
    assert [r.target_lang for r in translations] == ["fr", "de", "es"] * 6 + ["fr", "de"]
    assert all(r.source_lang == "en" and r.encoder_decoder for r in translations)
    assert all(r.target_prompt_tokens <= 24 - SOURCE_MARKERS and r.max_tokens <= 63 for r in translations)
    assert max(r.max_tokens for r in translations) > 32  # the decoder holds the output alone, not the source
    body = completion_body(translations[1].prompt, **translations[1].options(ignore_eos=True))
    assert (body["source_lang"], body["target_lang"]) == ("en", "de")
    for r in requests[1::2]:  # the decoder-only model's requests carry no language
        body = completion_body(r.prompt, **r.options(ignore_eos=True))
        assert r.model == "lm" and not {"source_lang", "target_lang"} & set(body)
        assert r.target_prompt_tokens + r.max_tokens <= 64


def test_context_verdict_compares_the_curve_with_theory():
    def points(ms):
        return [{"context": c, "ms_per_token": m} for c, m in zip([16, 64, 256, 1024], ms)]

    flat, rising = points([2.0, 2.1, 1.9, 2.05]), points([2.0, 2.2, 2.9, 5.0])
    assert verdict("lstm", flat, 0.15)["agrees"] is True
    assert verdict("gcnn", rising, 0.15)["agrees"] is False
    good = verdict("transformer", rising, 0.15)
    assert good["agrees"] is True and good["growth"] > 1 and "as theory says" in good["text"]
    assert verdict("transformer", flat, 0.15)["agrees"] is False


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://example.com", "https://192.168.1.5"])
def test_non_loopback_url_is_refused(url, tmp_path, capsys):
    with pytest.raises(ValueError, match="--allow-remote"):
        require_loopback(url, allow_remote=False)
    require_loopback(url, allow_remote=True)
    assert main(["bench", "--url", url, "--out", str(tmp_path / "x.json")]) == 2
    assert "not a loopback address" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    for ok in ("http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:8000"):
        require_loopback(ok, allow_remote=False)


# ---- against a live server -----------------------------------------------------------

SUMMARY_FIELDS = {"request_throughput", "output_token_throughput", "ttft_s", "itl_s", "tpot_s", "e2e_s",
                  "errors_by_status", "num_ok", "num_sent", "duration_s", "by_strategy", "by_model"}


def test_fixed_concurrency_run_writes_the_json(live_server, tmp_path, capsys):
    code, result = bench(tmp_path, live_server.url, "--num-requests", "8", "--concurrency", "3",
                         "--mix", "greedy=0.4,top_p=0.3,beam=0.1,n2=0.2", "--seed", "1")
    assert code == 0
    assert {"machine", "workload", "runs", "models", "tokens_per_word"} <= set(result)
    assert result["machine"]["cores"] >= 1 and result["machine"]["cpu"]
    (run,) = result["runs"]
    s = run["summary"]
    assert SUMMARY_FIELDS <= set(s)
    assert s["num_ok"] == 8 and s["errors_by_status"] == {} and s["concurrency"] == 3
    for key in ("ttft_s", "itl_s", "e2e_s"):
        assert {"p50", "p90", "p99", "mean", "count"} <= set(s[key]) and s[key]["count"] > 0
        assert 0 < s[key]["p50"] <= s[key]["p90"] <= s[key]["p99"]
    assert s["request_throughput"] > 0 and s["output_token_throughput"] > 0
    assert {r["model"] for r in run["requests"]} == {"tiny-transformer", "tiny-lstm", "tiny-gcnn"}
    # exactly max_tokens per choice (ignore_eos), counted from the server's usage
    spec = result["workload"]
    assert all(spec["max_tokens"][0] <= r["completion_tokens"] for r in run["requests"])
    out = capsys.readouterr().out
    assert "time to first token" in out and "errors: none" in out


def test_poisson_run(live_server, tmp_path):
    code, result = bench(tmp_path, live_server.url, "--num-requests", "6", "--rate", "20", "--model", "tiny-lstm",
                         "--mix", "greedy,sample", "--no-stream")
    assert code == 0
    s = result["runs"][0]["summary"]
    assert s["rate"] == 20 and s["concurrency"] is None
    assert s["num_ok"] == 6 and s["errors_by_status"] == {}
    assert s["ttft_s"]["count"] == 0 and s["e2e_s"]["count"] == 6  # not streamed: end to end only
    starts = [r["start_s"] for r in result["runs"][0]["requests"]]
    assert starts == sorted(starts) and starts[-1] > 0


def test_duration_cap_stops_the_run(live_server, tmp_path):
    code, result = bench(tmp_path, live_server.url, "--num-requests", "50", "--rate", "2", "--duration", "1",
                         "--model", "tiny-gcnn", "--mix", "greedy")
    s = result["runs"][0]["summary"]
    assert code == 0 and s["hit_duration_cap"] and s["num_sent"] < 50 and s["num_not_sent"] > 0


def test_sweep_writes_png_plots(live_server, tmp_path):
    code, result = bench(tmp_path, live_server.url, "--num-requests", "4", "--sweep", "1,2", "--model", "tiny-gcnn",
                         "--mix", "greedy=0.5,top_k=0.5")
    assert code == 0
    assert [r["summary"]["concurrency"] for r in result["runs"]] == [1, 2]
    names = {p.rsplit("/", 1)[-1] for p in result["plots"]}
    assert names == {"throughput_vs_concurrency.png", "latency_vs_concurrency.png", "ttft_distribution.png"}
    for path in result["plots"]:
        with open(path, "rb") as f:
            assert f.read(8) == PNG_MAGIC


def test_context_sweep_table(live_server, tmp_path, capsys):
    code, result = bench(tmp_path, live_server.url, "--context-sweep", "--context-lengths", "4,8,16,1000",
                         "--context-decode-tokens", "4", "--context-repeats", "1")
    assert code == 0
    sweep = result["context_sweep"]["models"]
    assert set(sweep) == {"tiny-transformer", "tiny-lstm", "tiny-gcnn"}
    # The transformer's context (64 tokens) caps its lengths; the recurrent models take them all.
    assert [p["target"] for p in sweep["tiny-lstm"]["points"]] == [4, 8, 16, 1000]
    assert max(p["target"] for p in sweep["tiny-transformer"]["points"]) <= 64 - 4
    for model in sweep.values():
        assert all(p["ms_per_token"] > 0 and p["num_samples"] > 0 for p in model["points"])
        assert model["expected"] in ("flat", "grows") and model["text"]
    out = capsys.readouterr().out
    assert "ms/token" in out and "tiny-lstm (lstm):" in out and "theory" in out
    with open(result["plots"][0], "rb") as f:
        assert f.read(8) == PNG_MAGIC


# ---- an encoder-decoder (translation) model ------------------------------------------

@pytest.fixture(scope="module")
def translation_server(tiny_checkpoints, tmp_path_factory):
    from tests.seq2seq_models import write_checkpoint

    m2m = tmp_path_factory.mktemp("m2m")
    write_checkpoint(m2m, "m2m_100")  # refuses a request without a source and a target language
    with LiveServer({"tiny-m2m": str(m2m), "tiny-lstm": tiny_checkpoints["tiny-lstm"]}) as server:
        yield server


def test_encoder_decoder_requests_carry_their_languages(translation_server, tmp_path, capsys):
    code, result = bench(tmp_path, translation_server.url, "--num-requests", "8", "--concurrency", "3",
                         "--mix", "greedy=0.5,beam=0.25,n2=0.25", "--source-lang", "en", "--target-lang", "fr,de")
    assert code == 0
    models = {m["id"]: m for m in result["models"]}
    assert models["tiny-m2m"]["encoder_decoder"] is True and models["tiny-lstm"]["encoder_decoder"] is False
    assert result["languages"] == {"tiny-m2m": {"source_lang": "en", "target_langs": ["fr", "de"]}}
    (run,) = result["runs"]
    s = run["summary"]
    assert s["num_ok"] == 8 and s["errors_by_status"] == {}  # the M2M100 model answers 400 without both languages
    translations = [r for r in run["requests"] if r["model"] == "tiny-m2m"]
    assert [(r["source_lang"], r["target_lang"]) for r in translations] == [("en", "fr"), ("en", "de")] * 2
    assert all(0 < r["prompt_tokens"] <= models["tiny-m2m"]["max_source_len"] for r in translations)
    assert all("target_lang" not in r for r in run["requests"] if r["model"] == "tiny-lstm")
    assert s["encoder_decoder"] == {"tiny-m2m": {"num_sent": 4, "num_ok": 4, "source_langs": ["en"],
                                                 "target_langs": ["de", "fr"]}}
    assert set(s["by_target_lang"]) == {"de", "fr"} and all(v["num_ok"] == 2 for v in s["by_target_lang"].values())
    out = capsys.readouterr().out
    assert "tiny-m2m (encoder-decoder): 4 of 4 ok, source language en, target languages de, fr" in out

    # No --target-lang: the model's own languages in turn, as /v1/models lists them.
    code, result = bench(tmp_path, translation_server.url, "--num-requests", "3", "--model", "tiny-m2m",
                         "--mix", "greedy", "--source-lang", "en")
    assert code == 0 and result["runs"][0]["summary"]["num_ok"] == 3
    assert [r["target_lang"] for r in result["runs"][0]["requests"]] == models["tiny-m2m"]["languages"][:3]


@pytest.mark.parametrize("flags, message", [
    ((), "refused the bench's languages (this checkpoint needs a source language"),
    (("--source-lang", "en", "--target-lang", "fr,xx"), "tiny-m2m does not take the language(s) xx"),
    (("--model", "tiny-lstm", "--target-lang", "fr"), "are for encoder-decoder models, and none of tiny-lstm"),
])
def test_languages_a_model_cannot_take_stop_the_bench_before_it_runs(translation_server, tmp_path, capsys, flags,
                                                                      message):
    out = tmp_path / "bench.json"
    assert main(["bench", "--url", translation_server.url, "--out", str(out), *SMALL, *flags]) == 2
    assert message in capsys.readouterr().err and not out.exists()
