"""The encoder-decoder Transformer against transformers' own models of each family: the logits of a whole
decoder sequence, computed at once and token by token from the cache, over an encoder output in blocks."""

from __future__ import annotations

import pytest
import torch

from quill.models.batch import StepBatch
from tests.conftest import KERNEL_DEVICE
from tests.seq2seq_models import VOCAB, load_quill_model, write_hf_model

pytest.importorskip("transformers")

FAMILIES = ["marian", "bart", "mbart", "m2m_100", "fsmt", "t5", "t5-gated", "mt5", "umt5", "umt5-tied"]


def _step(model, state, tokens: list[int], start: int, source_len: int, tables) -> torch.Tensor:
    device = model.embed.weight.device
    batch = StepBatch.build([tokens], [start], block_tables=[[5, 6]], logits="all", device=device)
    batch.cross_tables = torch.tensor([tables], device=device)
    batch.cross_lens = torch.tensor([source_len], device=device)
    return model.step(batch, state).cpu()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attention_backend", ["sdpa", "cpu", "triton"])
def test_logits_equal_transformers(tmp_path, family, attention_backend):
    """triton: on the GPU where there is one, else in the Triton interpreter on the CPU."""
    if attention_backend == "triton":
        pytest.importorskip("triton", reason="needs the triton package (the test extra installs it on Linux x86-64)")
    reference = write_hf_model(tmp_path, family)
    model = load_quill_model(tmp_path, KERNEL_DEVICE if attention_backend == "triton" else torch.device("cpu"))
    torch.manual_seed(1)
    source = torch.randint(3, VOCAB - 20, (9,)).tolist()  # within every family's source vocabulary
    target = [model.config.decoder_start_token_id] + torch.randint(2, VOCAB, (6,)).tolist()
    with torch.no_grad():
        # use_cache=False: FSMT's forward drops its causal mask when it may cache (it expects one token a call)
        expected = reference(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([target]),
                             use_cache=False).logits[0]
    state = model.new_state(8, block_size=4, num_encoder_blocks=6, attention_backend=attention_backend)
    tables = [4, 2, 3]  # blocks out of order, some unused
    model.encode([source], [tables], state)
    whole = _step(model, state, target, 0, len(source), tables)
    torch.testing.assert_close(whole, expected, rtol=1e-4, atol=5e-4)
    state = model.new_state(8, block_size=4, num_encoder_blocks=6, attention_backend=attention_backend)
    model.encode([source], [tables], state)
    pieces = [_step(model, state, target[:3], 0, len(source), tables)]
    pieces += [_step(model, state, [t], i, len(source), tables) for i, t in enumerate(target[3:], 3)]
    torch.testing.assert_close(torch.cat(pieces), expected, rtol=1e-4, atol=5e-4)


@pytest.mark.parametrize("family", ["marian", "mbart", "fsmt", "t5", "umt5"])
def test_alignment_is_the_last_layers_cross_attention_averaged_over_heads(tmp_path, family):
    """StepBatch.alignment (what the coverage penalty sums): the last decoder layer's cross-attention weights,
    averaged over its heads, summed over the step's tokens, as transformers returns them (cross_attentions)."""
    reference = write_hf_model(tmp_path, family)
    reference.set_attn_implementation("eager")  # the one that returns its weights
    model = load_quill_model(tmp_path)
    assert model.aligns
    torch.manual_seed(2)
    source = torch.randint(3, VOCAB - 20, (7,)).tolist()
    target = [model.config.decoder_start_token_id] + torch.randint(2, VOCAB, (5,)).tolist()
    with torch.no_grad():
        out = reference(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([target]), use_cache=False,
                        output_attentions=True)
    expected = out.cross_attentions[-1][0].mean(0)  # (target tokens, source tokens)
    state = model.new_state(8, block_size=4, num_encoder_blocks=6)
    tables = [4, 2]
    model.encode([source], [tables], state)
    for start, end in ((0, 4), (4, 5), (5, 6)):
        batch = StepBatch.build([target[start:end]], [start], block_tables=[[5, 6]], logits="last")
        batch.cross_tables, batch.cross_lens = torch.tensor([tables]), torch.tensor([len(source)])
        batch.want_alignment = True
        model.step(batch, state)
        torch.testing.assert_close(batch.alignment[0], expected[start:end].sum(0), rtol=1e-4, atol=1e-5)


def test_sources_encoded_together_equal_alone(tmp_path):
    """Sources of different lengths padded into one encoder pass write what each writes alone."""
    write_hf_model(tmp_path, "marian")
    model = load_quill_model(tmp_path)
    sources = [[5, 6, 7, 0], list(range(2, 13)) + [0], [9, 0]]
    tables = [[0], [1, 2, 3], [4]]
    together = model.new_state(2, block_size=4, num_encoder_blocks=5)
    model.encode(sources, tables, together)
    for source, table in zip(sources, tables):
        alone = model.new_state(2, block_size=4, num_encoder_blocks=5)
        model.encode([source], [table], alone)
        n = len(source)
        flat = lambda cache: cache[:, table].flatten(1, 2)[:, :n]  # noqa: E731
        torch.testing.assert_close(flat(together.encoder.k), flat(alone.encoder.k), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(flat(together.encoder.v), flat(alone.encoder.v), rtol=1e-5, atol=1e-5)
