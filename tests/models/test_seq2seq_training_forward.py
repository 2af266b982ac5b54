"""The training forwards (quill/models/training/seq2seq_forward.py) against the families' inference path: for every
family, a padded batch's teacher-forced log-probabilities equal those of `encode` + `step` run on each pair alone,
and gradients reach every parameter."""

from __future__ import annotations

import pytest
import torch

from quill.models.batch import StepBatch
from quill.models.families.fconv_seq2seq import FConvSeq2Seq, FConvSeq2SeqConfig
from quill.models.families.rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqConfig
from quill.models.families.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from quill.models.training.seq2seq_forward import TRAINING_FORWARDS

VOCAB, PAD, START, BLOCK = 40, 1, 2, 4
SOURCES = [[5, 9, 3, 7, 11, 4, 8, 2], [6, 12, 2], [13, 4, 21, 7, 9, 2]]
TARGETS = [[START, 8, 14, 9], [START, 17, 5, 6, 10, 30, 22], [START, 4]]

MODELS = {  # architecture -> (config class, model class, tiny shapes)
    "seq2seq": (Seq2SeqConfig, Seq2SeqTransformer, dict(
        d_model=16, encoder_layers=2, decoder_layers=2, n_heads=2, encoder_ffn=24, decoder_ffn=24, max_source_len=16,
        max_seq_len=16, decoder_start_token_id=START, pad_token_id=PAD)),
    "fconv_seq2seq": (FConvSeq2SeqConfig, FConvSeq2Seq, dict(
        encoder_embed_dim=12, decoder_embed_dim=12, out_embed_dim=10, max_source_len=16, max_seq_len=16,
        encoder_layers=[[12, 3, 1], [16, 3, 1], [16, 2, 2]], decoder_layers=[[12, 3, 1], [16, 2, 1], [16, 3, 2]],
        decoder_attention=[True, False, True])),
    "rnn_seq2seq": (RNNSeq2SeqConfig, RNNSeq2Seq, dict(
        source_vocab_size=VOCAB, hidden_size=12, layers=2, source_embed_dim=10, target_embed_dim=11)),
}
VARIANTS = [
    ("seq2seq", {}),
    ("seq2seq", dict(pre_norm=True, final_norm=True, embed_scale=4.0, positional="learned", output_bias=True)),
    ("seq2seq", dict(positional="sinusoidal_fairseq", position_offset=2, tie_output=False, activation="relu")),
    ("fconv_seq2seq", {}),
    ("fconv_seq2seq", dict(share_input_output_embed=True, out_embed_dim=12)),
    ("rnn_seq2seq", {}),
    ("rnn_seq2seq", dict(bidirectional=True, global_attention="mlp", bridge=True)),
    ("rnn_seq2seq", dict(rnn_type="GRU", global_attention="dot", share_decoder_embeddings=True, target_embed_dim=12)),
    ("rnn_seq2seq", dict(input_feed=False)),
]


def tiny_model(architecture: str, **options):
    config_cls, model_cls, shapes = MODELS[architecture]
    torch.manual_seed(0)
    model = model_cls(config_cls(vocab_size=VOCAB, **{**shapes, **options}))
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.5, 0.5)
    return model


def padded(rows: list[list[int]]) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([row + [PAD] * (width - len(row)) for row in rows])


def step_log_probs(model, source: list[int], target: list[int]) -> torch.Tensor:
    """(len(target), V): the source encoded into blocks out of order, the whole target in one step."""
    rows = len(source) + getattr(model, "encoder_state_rows", 0)
    tables = [7, 3, 5, 0, 6][: -(-rows // BLOCK)]
    if isinstance(model, Seq2SeqTransformer):
        state = model.new_state(8, block_size=BLOCK, num_encoder_blocks=8)
        batch = StepBatch.build([target], [0], block_tables=[[4, 1]], logits="all")
    else:
        state = model.new_state(2, block_size=BLOCK, num_encoder_blocks=8)
        batch = StepBatch.build([target], [0], slots=[1], logits="all")
    model.encode([source], [tables], state)
    batch.cross_tables, batch.cross_lens = torch.tensor([tables]), torch.tensor([len(source)])
    return torch.log_softmax(model.step(batch, state).float(), dim=-1)


@pytest.mark.parametrize("architecture, options", VARIANTS, ids=[f"{a}-{i}" for i, (a, _) in enumerate(VARIANTS)])
def test_the_training_forward_equals_encode_and_step(architecture, options):
    model = tiny_model(architecture, **options).eval()
    forward = TRAINING_FORWARDS[architecture]
    with torch.no_grad():
        got = forward(model, padded(SOURCES), torch.tensor([len(s) for s in SOURCES]), padded(TARGETS))
    assert got.shape == (len(SOURCES), max(map(len, TARGETS)), VOCAB) and got.dtype == torch.float32
    for i, (source, target) in enumerate(zip(SOURCES, TARGETS)):
        expected = step_log_probs(model, source, target)
        torch.testing.assert_close(got[i, : len(target)], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("architecture", sorted(MODELS))
def test_gradients_reach_every_parameter(architecture):
    model = tiny_model(architecture).train()
    log_probs = TRAINING_FORWARDS[architecture](model, padded(SOURCES), torch.tensor([len(s) for s in SOURCES]),
                                                padded(TARGETS))
    next_tokens = padded([target[1:] + [START] for target in TARGETS])
    loss = torch.nn.functional.nll_loss(log_probs.flatten(0, 1), next_tokens.flatten(), ignore_index=PAD)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
