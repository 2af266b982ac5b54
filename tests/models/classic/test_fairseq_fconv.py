"""fairseq fconv_lm checkpoints: read as fairseq wrote them, scored as fairseq scores them, whole or in
steps; what is not an fconv_lm (or would run code) is refused by name."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import pytest
import torch

from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import load_checkpoint, save_checkpoint
from quill.models.classic import fairseq_fconv
from quill.models.classic.conversion import convert, find_format
from quill.models.loading.errors import CheckpointError
from tests.models.classic.fairseq_fconv_reference import TINY_VOCAB, write_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm. is deprecated:FutureWarning")

PROMPT = [2, 5, 9, 30, 50, 70, 4, 4, 12, 41, 39, 20, 19, 40, 7, 66, 3, 2, 8, 21]


class Meter:
    """A class of the training code's own, as fairseq's meters are: never to be unpickled."""


def log_probs(model, tokens: list[int]) -> torch.Tensor:
    return torch.log_softmax(model(torch.tensor([tokens]))[0], dim=-1)


@pytest.fixture(scope="module", params=[True, False], ids=["adaptive", "fc3"])
def pair(request, tmp_path_factory):
    """(reference model, converted checkpoint) from one model.pt + dict.txt."""
    directory = tmp_path_factory.mktemp("fconv")
    reference = write_checkpoint(directory, adaptive=request.param)
    return reference, convert(directory)


def test_full_prompt_scores_equal_fairseqs(pair):
    reference, converted = pair
    assert converted.architecture == "fconv" and converted.metadata["source_format"] == "fconv_lm"
    torch.testing.assert_close(log_probs(converted.model, PROMPT), reference.log_probs(PROMPT), atol=1e-5, rtol=0)


def run_in_chunks(model, seqs: list[list[int]], chunk_sizes: list[int]) -> list[torch.Tensor]:
    """Each sequence fed `chunk_sizes[i]` tokens per step, all in one batch; every row's scores."""
    state = model.new_state(len(seqs) + 1)
    done, got = [0] * len(seqs), [[] for _ in seqs]
    while any(d < len(s) for d, s in zip(done, seqs)):
        active = [i for i, s in enumerate(seqs) if done[i] < len(s)]
        chunks = [seqs[i][done[i]:done[i] + chunk_sizes[i]] for i in active]
        batch = StepBatch.build(chunks, [done[i] for i in active], slots=[i + 1 for i in active], logits="all")
        for i, rows in zip(active, model.step(batch, state).split(batch.query_lens)):
            got[i].append(rows)
            done[i] += len(rows)
    return [torch.log_softmax(torch.cat(g), dim=-1) for g in got]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, len(PROMPT)])
def test_chunked_prefill_and_single_steps_equal_the_full_forward(pair, chunk):
    reference, converted = pair
    got = run_in_chunks(converted.model, [PROMPT], [chunk])[0]
    torch.testing.assert_close(got, reference.log_probs(PROMPT), atol=1e-5, rtol=0)


def test_a_batch_of_different_chunk_sizes_equals_each_alone(pair):
    reference, converted = pair
    seqs = [PROMPT, PROMPT[:7], [2, 60, 61], PROMPT[::-1]]
    for got, seq in zip(run_in_chunks(converted.model, seqs, [4, 1, 3, 6]), seqs):
        torch.testing.assert_close(got, reference.log_probs(seq), atol=1e-5, rtol=0)


def test_weight_norm_of_old_decoders_folds_the_same(tmp_path):
    """Decoders before fairseq's version 2 normalised conv weights over dim 0, not 2."""
    reference = write_checkpoint(tmp_path, conv_norm_dim=0)
    assert fairseq_fconv.detect(tmp_path)
    torch.testing.assert_close(log_probs(convert(tmp_path).model, PROMPT), reference.log_probs(PROMPT),
                               atol=1e-5, rtol=0)


def test_a_file_in_torchs_legacy_format_reads_the_same(tmp_path):
    reference = write_checkpoint(tmp_path, legacy_file=True)
    assert fairseq_fconv.detect(tmp_path)
    torch.testing.assert_close(log_probs(convert(tmp_path).model, PROMPT), reference.log_probs(PROMPT),
                               atol=1e-5, rtol=0)


def test_newer_cfg_form_reads_like_args(tmp_path):
    reference = write_checkpoint(tmp_path, cfg_form=True)
    torch.testing.assert_close(log_probs(convert(tmp_path / "model.pt").model, PROMPT),
                               reference.log_probs(PROMPT), atol=1e-5, rtol=0)


def test_saved_as_a_quill_checkpoint_it_loads_back_the_same(pair, tmp_path):
    _, converted = pair
    save_checkpoint(tmp_path, converted.architecture, converted.model, converted.tokenizer, dtype=torch.float32,
                    metadata=converted.metadata)
    loaded = load_checkpoint(tmp_path, device="cpu", dtype="float32")
    assert loaded.model.config == converted.model.config
    assert loaded.eos_token_ids == [2] and loaded.metadata["fairseq_arch"] == "fconv_lm"
    text = "w1 w7\nw3 nonsense"
    assert loaded.tokenizer.encode(text) == converted.tokenizer.encode(text)
    torch.testing.assert_close(loaded.model(torch.tensor([PROMPT])), converted.model(torch.tensor([PROMPT])))


def test_dictionary_as_fairseq_numbers_it(pair):
    _, converted = pair
    tokenizer = converted.tokenizer
    assert tokenizer.vocab_size == TINY_VOCAB  # 4 specials + 61 words + 7 madeupwords
    assert [tokenizer.id_to_token(i) for i in (0, 1, 2, 3, 4, 64, 65, 71)] == [
        "<s>", "<pad>", "</s>", "<unk>", "w0", "w60", "madeupword0000", "madeupword0006"]
    # A prompt begins with </s>, as fairseq's inference does; a newline is the </s> that ends a line.
    assert tokenizer.encode("w0 w1\nw2 unheard") == [2, 4, 5, 2, 6, 3]
    assert tokenizer.decode([2, 4, 5, 2, 6, 3]) == "w0 w1 w2 <unk>"
    assert converted.metadata["dictionary_words"] == 65 and converted.metadata["padding_words"] == 7


def test_detection_needs_an_fconv_model_pt_with_dict_txt(tmp_path):
    write_checkpoint(tmp_path / "fconv")
    assert find_format(tmp_path / "fconv") is fairseq_fconv.FORMAT
    assert fairseq_fconv.detect(tmp_path / "fconv" / "model.pt")
    (tmp_path / "fconv" / "dict.txt").unlink()
    assert not fairseq_fconv.detect(tmp_path / "fconv")
    write_checkpoint(tmp_path / "transformer", args=dict(arch="transformer_lm"))
    assert not fairseq_fconv.detect(tmp_path / "transformer")


def refusal(directory: Path) -> str:
    with pytest.raises(CheckpointError) as error:
        convert(directory, format_name="fconv_lm")
    return str(error.value)


def test_a_class_outside_the_allow_list_is_refused_by_name(tmp_path):
    write_checkpoint(tmp_path, extra={"extra_state": {"metrics": Meter()}})
    assert f"{__name__}.Meter" in refusal(tmp_path)


def test_a_cfg_kept_as_omegaconf_objects_is_refused_with_the_way_out(tmp_path, monkeypatch):
    package, module = types.ModuleType("omegaconf"), types.ModuleType("omegaconf.dictconfig")
    DictConfig = type("DictConfig", (), {"__module__": "omegaconf.dictconfig"})
    package.dictconfig, module.DictConfig = module, DictConfig
    monkeypatch.setitem(sys.modules, "omegaconf", package)  # a stand-in, only for pickling one
    monkeypatch.setitem(sys.modules, "omegaconf.dictconfig", module)
    write_checkpoint(tmp_path, extra={"args": None, "cfg": DictConfig()})
    message = refusal(tmp_path)
    assert "omegaconf.dictconfig.DictConfig" in message and "OmegaConf.to_container" in message


def test_decoder_layers_that_would_run_code_are_refused(tmp_path):
    witness = tmp_path / "ran"
    write_checkpoint(tmp_path, args=dict(decoder_layers=f"__import__('os').system('touch {witness}')"))
    message = refusal(tmp_path)
    assert "decoder_layers" in message and "__import__" in message
    assert not witness.exists()


@pytest.mark.parametrize("layers", ["[(24, 3)] * 10**9", "[(24, 3)] * 999999999", "[(24, 3)].__class__",
                                    "[lambda: 1]", "[(24, 3.5)]", "[(24,)]", "24"])
def test_decoder_layers_that_are_not_lists_of_layers_are_refused(tmp_path, layers):
    write_checkpoint(tmp_path, args=dict(decoder_layers=layers))
    assert "decoder_layers" in refusal(tmp_path)


def test_layers_that_do_not_fit_the_weights_are_refused(tmp_path):
    write_checkpoint(tmp_path, args=dict(decoder_layers="[(24, 3)] * 2 + [(32, 1)]"))
    assert "does not fit decoder_layers" in refusal(tmp_path)


@pytest.mark.parametrize("args, words", [
    (dict(decoder_attention="True"), "decoder_attention"),
    (dict(decoder_attention="[False] * 5 + [True]"), "decoder_attention"),
    (dict(arch="lstm_lm"), "'lstm_lm'"),
])
def test_what_is_not_a_language_model_fconv_is_refused(tmp_path, args, words):
    write_checkpoint(tmp_path, args=args)
    assert words in refusal(tmp_path)


def test_an_adaptive_softmax_of_pre_version_fairseq_is_refused(tmp_path):
    reference = write_checkpoint(tmp_path)
    checkpoint = torch.load(tmp_path / "model.pt", weights_only=False)
    del checkpoint["model"]["decoder.adaptive_softmax.version"]
    torch.save(checkpoint, tmp_path / "model.pt")
    assert "adaptive_softmax.version" in refusal(tmp_path)
    del reference


def test_arguments_that_are_neither_args_nor_cfg_are_refused(tmp_path):
    write_checkpoint(tmp_path, extra={"args": None})
    assert "neither `args` nor a `cfg`" in refusal(tmp_path)


def test_namespace_is_rebuilt_inert(tmp_path):
    """argparse.Namespace is allowed as a record of attributes, never as the class itself."""
    write_checkpoint(tmp_path)
    args = fairseq_fconv.load_restricted(tmp_path / "model.pt", fairseq_fconv.ALLOWED_CLASSES)["args"]
    assert not isinstance(args, argparse.Namespace) and args.decoder_embed_dim == 20
