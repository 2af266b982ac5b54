"""toolkit_seq2seq_bench on tiny shapes, in seconds: the step loops one at a time and in padded static batches,
Quill's engine, and what the comparison rests on (every source 32 tokens there, 8 here, and the same greedy tokens
on both sides). Structure and agreement, never speed."""

from __future__ import annotations

import json

from benchmarks.common import toolkit_loops as tl
from benchmarks.toolkit_seq2seq_bench import CONTENDERS, SMOKE, main


def test_smoke_run_reports_every_contender_and_the_loops_agree_with_quill(tmp_path):
    out = tmp_path / "toolkit.json"
    results = main(["--smoke", "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["machine"]["cpu"] and results["threads"] == 1 and set(results["models"]) == {"fconv", "lstm"}
    for name, r in results["models"].items():
        assert set(r["runs"]) == set(r["medians"]) == set(CONTENDERS)
        for contender, runs in r["runs"].items():
            (run,) = runs  # --smoke: one repeat
            assert run["sentences"] == SMOKE.sources
            assert run["generated_tokens"] == SMOKE.sources * SMOKE.new_tokens  # the end token barred throughout
            assert run["sentences_per_s"] > 0 and run["tokens_per_s"] > 0
        assert r["quill_over_static"] > 0 and r["quill_over_one_at_a_time"] > 0
        for loop in ("loop_static", "loop_one_at_a_time"):  # float32 on both sides: the same greedy tokens
            assert r["agreement"][loop]["fraction"] == 1.0, (name, loop, r["agreement"][loop])
        assert r["agreement"]["loop_static"]["distinct_tokens"] > SMOKE.sources  # not one token per source
        lens = r["workload"]["source_lens"]
        assert SMOKE.source_lens[0] <= lens[0] < lens[1] <= SMOKE.source_lens[1]  # static batches are padded


def test_one_model_and_fewer_sources_one_at_a_time():
    results = main(["--smoke", "--threads", "1", "--models", "lstm", "--serial-sources", "2"])
    (r,) = results["models"].values()
    assert r["runs"]["loop_one_at_a_time"][0]["sentences"] == 2 and r["agreement"]["loop_one_at_a_time"]["sources"] == 2
    assert r["runs"]["quill"][0]["sentences"] == SMOKE.sources


def test_the_shapes_are_the_toolkits_published_ones():
    fconv = tl.fconv_config()
    expected = [[512, 3, 1]] * 6 + [[768, 3, 1]] * 4 + [[1024, 3, 1]] * 3 + [[2048, 1, 1], [4096, 1, 1]]
    assert fconv.encoder_layers == fconv.decoder_layers == expected
    assert (fconv.encoder_embed_dim, fconv.decoder_embed_dim, fconv.out_embed_dim) == (768, 768, 512)
    assert all(fconv.decoder_attention) and fconv.vocab_size == fconv.source_vocab_size == 40_000
    lstm = tl.lstm_config()
    assert (lstm.layers, lstm.hidden_size, lstm.source_embed_dim, lstm.target_embed_dim) == (2, 500, 500, 500)
    assert lstm.bidirectional and lstm.input_feed and lstm.global_attention == "general" and lstm.rnn_type == "LSTM"
    assert (lstm.source_vocab_size, lstm.vocab_size) == (50_002, 50_004)


def test_sources_end_in_eos_for_fairseq_only():
    fairseq = tl.random_sources(20, (8, 48), 100, 4, tl.FAIRSEQ_EOS, seed=0)
    opennmt = tl.random_sources(20, (8, 48), 100, 2, None, seed=0)
    assert all(8 <= len(s) <= 48 for s in fairseq + opennmt)
    assert all(s[-1] == tl.FAIRSEQ_EOS and tl.FAIRSEQ_EOS not in s[:-1] for s in fairseq)
    assert all(min(s) >= 2 for s in opennmt)
