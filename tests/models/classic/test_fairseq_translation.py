"""fairseq's Transformer translation checkpoints, as fairseq saves them, converted and served: greedy and beam answers
through a busy engine equal a reference's (transformers' FSMT, the port of fairseq's own Transformer, run on the
same weights); the pickle read through the allow-list; a dictionary that disagrees with the weights refused."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from quill.models.classic.conversion import convert
from quill.models.loading.checkpoint import load_checkpoint
from quill.models.loading.errors import CheckpointError
from tests.models.classic.fairseq_translation_files import SENTENCES, write_fairseq_checkpoint
from tests.seq2seq_models import write_hf_model
from tests.toolkit_reference import check_against_reference

pytest.importorskip("transformers")

SOURCE_ROWS, TARGET_ROWS = 180, 200
ARGS = dict(encoder_attention_heads=4, decoder_attention_heads=4, encoder_normalize_before=False,
            decoder_normalize_before=False, activation_fn="relu", max_source_positions=64, max_target_positions=64,
            share_decoder_input_output_embed=False, share_all_embeddings=False, encoder_learned_pos=False,
            decoder_learned_pos=False, dropout=0.3)


def _fairseq_state(reference) -> dict[str, torch.Tensor]:
    """FSMT's weights under fairseq's names (FSMT keeps them, under "model."), the sinusoids as fairseq keeps them
    (a placeholder buffer), the format's version entries."""
    state = {k.removeprefix("model."): v.clone() for k, v in reference.state_dict().items()}
    for stack in ("encoder", "decoder"):
        del state[f"{stack}.embed_positions.weight"]
        state[f"{stack}.embed_positions._float_tensor"] = torch.zeros(1)
        state[f"{stack}.version"] = torch.tensor([3.0])
    return state


@pytest.fixture(scope="module")
def fairseq_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("fairseq")
    reference = write_hf_model(root / "hf", "fsmt", vocab_size=TARGET_ROWS, src_vocab_size=SOURCE_ROWS)
    write_fairseq_checkpoint(root / "wmt", _fairseq_state(reference), "transformer_wmt_en_de", SOURCE_ROWS,
                             TARGET_ROWS, **ARGS)
    converted = convert(root / "wmt")
    loaded = load_checkpoint(converted.save(root / "quill"), device="cpu", dtype="float32")
    return root, reference, loaded


def test_converted_answers_equal_the_reference(fairseq_model):
    _, reference, loaded = fairseq_model
    assert loaded.is_encoder_decoder and loaded.seq2seq.pair == ("en", "de")
    sources = [loaded.seq2seq.source_ids(text) for text in SENTENCES]
    assert all(s[-1] == 2 and 3 not in s for s in sources)  # </s> ends each; every piece is in the dictionary

    def next_logprobs_of(source):
        def step(prefix):
            with torch.no_grad():
                logits = reference(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([prefix])).logits
            return logits[0, -1].log_softmax(-1)
        return step

    check_against_reference(loaded, sources, next_logprobs_of, max_tokens=10, width=3, n=2)


def test_answer_text_is_detokenized(fairseq_model):
    _, _, loaded = fairseq_model
    words = loaded.seq2seq.source_ids(SENTENCES[1])[:-1]  # the target dictionary numbers the pieces the same
    assert loaded.tokenizer.decode(words) == SENTENCES[1]


def test_foreign_callable_is_refused(fairseq_model, tmp_path):
    root, _, _ = fairseq_model
    for name in ("dict.en.txt", "dict.de.txt", "bpecodes"):
        (tmp_path / name).write_bytes((root / "wmt" / name).read_bytes())
    # a pickle that would call os.system when loaded by a plain torch.load
    torch.save({"args": argparse.Namespace(arch="transformer", source_lang="en", target_lang="de"),
                "model": {}, "hook": os.system}, tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="system"):
        convert(tmp_path)


def test_dictionary_that_disagrees_is_refused(fairseq_model, tmp_path):
    root, _, _ = fairseq_model
    for name in ("model.pt", "dict.en.txt", "bpecodes"):
        (tmp_path / name).write_bytes((root / "wmt" / name).read_bytes())
    words = [f"w{i}" for i in range(TARGET_ROWS + 10)]
    (tmp_path / "dict.de.txt").write_text("".join(f"{w} 1\n" for w in words))
    with pytest.raises(CheckpointError, match=r"dict\.de\.txt.*embeds only 200"):
        convert(tmp_path)
