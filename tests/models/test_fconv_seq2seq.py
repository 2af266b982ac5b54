"""fairseq's convolutional translation model against a reference written here from the paper's equations, with
fairseq's conventions and parameter names (weight-normed layers, ConvTBC weights, left-padded sources numbered
by make_positions): whole target sequences at once, where Quill's model runs them through `step` a token or a
chunk at a time over an encoder output in blocks, and the checks that refuse arguments that do not fit the weights."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import weight_norm

from quill.models.attention.cpu_kernel import kernel
from quill.models.batch import StepBatch
from quill.models.classic.fairseq_fconv_mt import fconv_translation_model
from quill.models.classic.literal_expression import literal_expression
from quill.models.families.registry import ARCHITECTURES
from quill.models.loading.errors import CheckpointError

# fairseq saves weight_g and weight_v, the names of torch's older weight-norm API
pytestmark = pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
PAD, EOS = 1, 2
SOURCE_VOCAB, TARGET_VOCAB = 37, 41
# mixed widths, an even kernel, 1x1 convolutions, residuals from two layers back and none
ARGS = {
    "arch": "fconv",
    "encoder_embed_dim": 16, "encoder_layers": "[(16, 3)] + [(24, 2)] + [(24, 3, 2)] + [(8, 1, 0)] + [(16, 5)]",
    "decoder_embed_dim": 16, "decoder_layers": "[(16, 3)] + [(24, 2)] + [(24, 4, 2)] + [(12, 1, 0)] + [(20, 3)]",
    "decoder_attention": "[True, False, True, False, True]", "decoder_out_embed_dim": 12,
    "share_input_output_embed": False, "max_source_positions": 16, "max_target_positions": 20,
}
PATH = Path("model.pt")
HALF = math.sqrt(0.5)


def make_positions(tokens: torch.Tensor) -> torch.Tensor:
    """fairseq's numbering: real tokens from PAD + 1 on, padding PAD."""
    real = tokens.ne(PAD).long()
    return torch.cumsum(real, dim=1) * real + PAD


def linear(in_features: int, out_features: int) -> nn.Module:
    return weight_norm(nn.Linear(in_features, out_features))


class ConvTBC(nn.Module):
    """fairseq's time-batch-channel convolution: weight (k, in, out)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(kernel_size, in_channels, out_channels))
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x: torch.Tensor, left: int, right: int) -> torch.Tensor:
        """x (T, B, C) zero-padded by `left` and `right` steps -> GLU of the convolution, (T, B, out / 2)."""
        return F.glu(torch.conv_tbc(F.pad(x, (0, 0, 0, 0, left, right)).contiguous(), self.weight, self.bias, 0), dim=2)


class Stack(nn.Module):
    def __init__(self, vocab: int, dim: int, positions: int, layers: list, norm_dim: int = 2):
        super().__init__()
        self.layers = [tuple(layer) + (1,) * (3 - len(layer)) for layer in layers]
        self.embed_tokens = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.embed_positions = nn.Embedding(positions, dim, padding_idx=PAD)
        width = self.layers[0][0]
        self.fc1 = linear(dim, width)
        self.projections, self.convolutions = nn.ModuleList(), nn.ModuleList()
        widths = [width]
        for out_channels, kernel_size, residual in self.layers:
            source = widths[-residual] if residual else out_channels
            self.projections.append(linear(source, out_channels) if source != out_channels else None)
            self.convolutions.append(weight_norm(ConvTBC(width, 2 * out_channels, kernel_size), dim=norm_dim))
            width = out_channels
            widths.append(width)

    def residual(self, i: int, x: torch.Tensor, outputs: list) -> torch.Tensor:
        back = self.layers[i][2]
        if not back:
            return x
        skip = outputs[-back] if self.projections[i] is None else self.projections[i](outputs[-back])
        return (x + skip) * HALF


class Encoder(Stack):
    def __init__(self, args: dict):
        super().__init__(SOURCE_VOCAB, args["encoder_embed_dim"], args["max_source_positions"],
                         literal_expression(args["encoder_layers"]))
        self.fc2 = linear(self.layers[-1][0], args["encoder_embed_dim"])

    def forward(self, src: torch.Tensor):
        """src (B, S), padded on the left -> z, (z + e) * sqrt(1/2), each (B, S, D), and the padding (B, S)."""
        padding = src.eq(PAD)
        e = self.embed_tokens(src) + self.embed_positions(make_positions(src))
        x = self.fc1(e).transpose(0, 1)
        outputs = [x]
        for i, (_, k, _) in enumerate(self.layers):
            x = x.masked_fill(padding.t()[..., None], 0.0)  # a convolution never sees the padding
            x = self.residual(i, self.convolutions[i](x, (k - 1) // 2, k // 2), outputs)
            outputs.append(x)
        z = self.fc2(x.transpose(0, 1)).masked_fill(padding[..., None], 0.0)
        return z, (z + e) * HALF, padding


class Attention(nn.Module):
    def __init__(self, channels: int, dim: int):
        super().__init__()
        self.in_projection = linear(channels, dim)
        self.out_projection = linear(dim, channels)

    def forward(self, x, target_embedding, z, values, padding):
        """x (B, T, C): softmax((in(x) + g) sqrt(1/2) . z) over the real source, times its values and s sqrt(1/s)."""
        q = (self.in_projection(x) + target_embedding) * HALF
        scores = torch.bmm(q, z.transpose(1, 2)).masked_fill(padding[:, None, :], float("-inf"))
        s = (~padding).sum(dim=1).float()[:, None, None]
        self.weights = scores.softmax(dim=-1)  # (B, T, S): fairseq averages them over the layers (alignment)
        context = torch.bmm(self.weights, values) * (s * torch.sqrt(1.0 / s))
        return (self.out_projection(context) + x) * HALF


class Decoder(Stack):
    def __init__(self, args: dict, conv_norm_dim: int = 2):
        super().__init__(TARGET_VOCAB, args["decoder_embed_dim"], args["max_target_positions"],
                         literal_expression(args["decoder_layers"]), conv_norm_dim)
        attention = literal_expression(args["decoder_attention"])
        attention = [attention] * len(self.layers) if isinstance(attention, bool) else attention
        self.attention = nn.ModuleList(Attention(out, args["decoder_embed_dim"]) if attends else None
                                       for (out, _, _), attends in zip(self.layers, attention))
        self.fc2 = linear(self.layers[-1][0], args["decoder_out_embed_dim"])
        if args["share_input_output_embed"]:
            self.fc3 = nn.Linear(args["decoder_out_embed_dim"], TARGET_VOCAB)
            self.fc3.weight = self.embed_tokens.weight
        else:
            self.fc3 = linear(args["decoder_out_embed_dim"], TARGET_VOCAB)
        self.register_buffer("version", torch.Tensor([2 if conv_norm_dim == 2 else 1]))

    def forward(self, prev: torch.Tensor, encoder_out) -> torch.Tensor:
        """prev (B, T) whole target sequences -> (B, T, V) logits."""
        z, values, padding = encoder_out
        g = self.embed_tokens(prev) + self.embed_positions(make_positions(prev))
        x = self.fc1(g).transpose(0, 1)
        outputs = [x]
        for i, (_, k, _) in enumerate(self.layers):
            y = self.convolutions[i](x, k - 1, 0)  # causal: k-1 zeros before the first step
            if self.attention[i] is not None:
                y = self.attention[i](y.transpose(0, 1), g, z, values, padding).transpose(0, 1)
            x = self.residual(i, y, outputs)
            outputs.append(x)
        return self.fc3(self.fc2(x.transpose(0, 1)))


class Reference(nn.Module):
    def __init__(self, args: dict, conv_norm_dim: int = 2, seed: int = 0):
        super().__init__()
        self.encoder = Encoder(args)
        self.decoder = Decoder(args, conv_norm_dim)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # magnitudes unlike their directions' norms, so that folding them matters
            for name, p in self.named_parameters():
                p.copy_(torch.rand(p.shape, generator=generator) + 0.5 if name.endswith("weight_g")
                        else torch.randn(p.shape, generator=generator) * (0.1 if name.endswith("bias") else 0.5))

    @torch.no_grad()
    def forward(self, sources: list[list[int]], targets: list[list[int]]) -> torch.Tensor:
        """Sources left-padded as fairseq pads them; targets all of one length."""
        longest = max(len(s) for s in sources)
        src = torch.tensor([[PAD] * (longest - len(s)) + s for s in sources])
        return self.decoder(torch.tensor(targets), self.encoder(src))


def load(reference: Reference, args: dict = ARGS):
    return fconv_translation_model(dict(args), reference.state_dict(), PATH)


def run_steps(model, state, targets, schedules, slots, tables, lengths) -> list[torch.Tensor]:
    """Each sequence's target through `step` in chunks of its schedule's sizes -> its logits, (T, V) each."""
    done, logits = [0] * len(targets), [[] for _ in targets]
    for i in range(max(len(s) for s in schedules)):
        seqs = [b for b, schedule in enumerate(schedules) if i < len(schedule)]
        chunks = [targets[b][done[b]:done[b] + schedules[b][i]] for b in seqs]
        batch = StepBatch.build(chunks, [done[b] for b in seqs], slots=[slots[b] for b in seqs], logits="all")
        width = max(len(tables[b]) for b in seqs)
        batch.cross_tables = torch.tensor([tables[b] + [0] * (width - len(tables[b])) for b in seqs])
        batch.cross_lens = torch.tensor([lengths[b] for b in seqs])
        for b, chunk, rows in zip(seqs, chunks, model.step(batch, state).split([len(c) for c in chunks])):
            logits[b].append(rows)
            done[b] += len(chunk)
    return [torch.cat(rows) for rows in logits]


@pytest.fixture(scope="module")
def pair():
    reference = Reference(ARGS)
    return reference, load(reference)


SCHEDULES = {
    "a token a step": [[1] * 6] * 4,
    "several tokens a step": [[3, 3], [2, 4], [6], [4, 2]],
    "decodes beside chunks": [[3, 3], [1] * 6, [6], [2, 1, 3]],
}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("attention_backend", ["sdpa", "cpu"])
def test_steps_equal_the_whole_sequence_reference(pair, schedule, attention_backend, monkeypatch):
    reference, model = pair
    if attention_backend == "cpu" and isinstance(kernel(), str):
        pytest.skip(f"the CPU attention kernel {kernel()}")
    monkeypatch.setattr(model, "attention_backend", attention_backend)  # "cpu": the kernel reads the blocks
    generator = torch.Generator().manual_seed(3)
    sources = [torch.randint(4, SOURCE_VOCAB, (n - 1,), generator=generator).tolist() + [EOS] for n in (7, 2, 5)]
    # four sequences; the last a second hypothesis of the first source, reading its blocks
    targets = [[EOS] + torch.randint(3, TARGET_VOCAB, (5,), generator=generator).tolist() for _ in range(4)]
    source_of = [0, 1, 2, 0]
    tables = [[5, 1], [3], [0, 6]]  # blocks of 4, out of order, some unused
    state = model.new_state(6, block_size=4, num_encoder_blocks=8)
    state.slots["windows"].normal_()  # stale windows of earlier sequences: reset below, as the engine does
    slots = [3, 0, 5, 1]
    state.slots.reset(slots)
    model.encode(sources, tables, state)  # different lengths in one pass
    expected = reference([sources[s] for s in source_of], targets)
    got = run_steps(model, state, targets, SCHEDULES[schedule], slots, [tables[s] for s in source_of],
                    [len(sources[s]) for s in source_of])
    for b in range(len(targets)):
        torch.testing.assert_close(got[b], expected[b], rtol=1e-5, atol=1e-5)


def test_only_the_scored_rows_are_returned(pair):
    reference, model = pair
    source, target = [7, 8, 9, EOS], [EOS, 5, 6, 7]
    state = model.new_state(1, block_size=4, num_encoder_blocks=1)
    model.encode([source], [[0]], state)
    batch = StepBatch.build([target], [0], slots=[0], logits="last")
    batch.cross_tables, batch.cross_lens = torch.tensor([[0]]), torch.tensor([len(source)])
    torch.testing.assert_close(model.step(batch, state), reference([source], [target])[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention_backend", ["sdpa", "cpu"])
def test_alignment_is_the_attention_layers_mean_summed_over_each_steps_tokens(pair, attention_backend, monkeypatch):
    """StepBatch.alignment (what the coverage penalty sums): fairseq's alignment, the attention layers' weights
    averaged, summed over each sequence's new tokens; zero past its source."""
    reference, model = pair
    assert model.aligns
    monkeypatch.setattr(model, "attention_backend", attention_backend)
    sources = [[5, 9, 3, 7, 11, 4, EOS], [6, EOS], [13, 4, 21, 7, EOS]]
    targets = [[EOS, 8, 14, 9, 3, 6], [EOS, 17, 5, 6, 10, 3], [EOS, 4, 4, 19, 7, 8]]
    expected = []
    for source, target in zip(sources, targets):
        reference([source], [target])
        layers = [a.weights[0] for a in reference.decoder.attention if a is not None]
        expected.append(torch.stack(layers).mean(0))  # (target tokens, source tokens)
    tables = [[5, 1], [3], [0, 6]]
    state = model.new_state(3, block_size=4, num_encoder_blocks=8)
    state.slots.reset([0, 1, 2])
    model.encode(sources, tables, state)
    done = [0, 0, 0]
    for schedule in ([3, 1, 6], [3, 5, 0]):
        seqs = [b for b, n in enumerate(schedule) if n]
        batch = StepBatch.build([targets[b][done[b]:done[b] + schedule[b]] for b in seqs], [done[b] for b in seqs],
                                slots=seqs, logits="all")
        width = max(len(tables[b]) for b in seqs)
        batch.cross_tables = torch.tensor([tables[b] + [0] * (width - len(tables[b])) for b in seqs])
        batch.cross_lens = torch.tensor([len(sources[b]) for b in seqs])
        batch.want_alignment = True
        model.step(batch, state)
        for row, b in enumerate(seqs):
            n, span = len(sources[b]), slice(done[b], done[b] + schedule[b])
            torch.testing.assert_close(batch.alignment[row, :n], expected[b][span].sum(0), rtol=1e-5, atol=1e-5)
            assert not batch.alignment[row, n:].any()
            done[b] += schedule[b]


FAIRSEQ_KEYS = """encoder.embed_tokens.weight encoder.embed_positions.weight encoder.fc1.weight_g encoder.fc1.weight_v
encoder.fc1.bias encoder.projections.1.weight_g encoder.projections.1.weight_v encoder.projections.1.bias
encoder.convolutions.0.weight_g encoder.convolutions.0.weight_v encoder.convolutions.0.bias
encoder.convolutions.1.weight_g encoder.convolutions.1.weight_v encoder.convolutions.1.bias encoder.fc2.weight_g
encoder.fc2.weight_v encoder.fc2.bias decoder.version decoder.embed_tokens.weight decoder.embed_positions.weight
decoder.fc1.weight_g decoder.fc1.weight_v decoder.fc1.bias decoder.convolutions.0.weight_g
decoder.convolutions.0.weight_v decoder.convolutions.0.bias decoder.attention.0.in_projection.weight_g
decoder.attention.0.in_projection.weight_v decoder.attention.0.in_projection.bias
decoder.attention.0.out_projection.weight_g decoder.attention.0.out_projection.weight_v
decoder.attention.0.out_projection.bias decoder.fc2.weight_g decoder.fc2.weight_v decoder.fc2.bias
decoder.fc3.weight decoder.fc3.bias""".split()
SMALL = {**ARGS, "encoder_layers": "[(8, 3), (12, 2)]", "decoder_layers": "[(8, 3)]", "decoder_attention": "True",
         "decoder_out_embed_dim": 16, "share_input_output_embed": True}


def test_the_reference_saves_the_names_fairseq_saves():
    assert sorted(Reference(SMALL).state_dict()) == sorted(FAIRSEQ_KEYS)


@pytest.mark.parametrize("variant", ["shared output embedding", "decoder of version 1"])
def test_a_fairseq_state_dict_loads_to_the_reference(variant):
    args = {**ARGS, "share_input_output_embed": True, "decoder_out_embed_dim": 16} if variant.startswith("shared") \
        else ARGS
    reference = Reference(args, conv_norm_dim=2 if variant.startswith("shared") else 0, seed=1)
    model = load(reference, args)
    sources, targets = [[4, 5, 6, 7, 8, EOS], [9, EOS]], [[EOS, 4, 5, 6, 7], [EOS, 8, 9, 10, 11]]
    state = model.new_state(2, block_size=4, num_encoder_blocks=3)
    model.encode(sources, [[2, 0], [1]], state)
    got = run_steps(model, state, targets, [[5], [5]], [0, 1], [[2, 0], [1]], [6, 2])
    torch.testing.assert_close(torch.stack(got), reference(sources, targets), rtol=1e-5, atol=1e-5)


def test_missing_arguments_take_the_architecture_defaults():
    args = {"arch": "fconv_iwslt_de_en", "max_source_positions": 8, "max_target_positions": 8}
    full = {**args, "encoder_embed_dim": 256, "encoder_layers": "[(256, 3)] * 4", "decoder_embed_dim": 256,
            "decoder_layers": "[(256, 3)] * 3", "decoder_out_embed_dim": 256, "decoder_attention": "True",
            "share_input_output_embed": False}
    config = load(Reference(full), args).config
    assert config.encoder_layers == [[256, 3, 1]] * 4 and config.decoder_layers == [[256, 3, 1]] * 3
    assert config.decoder_attention == [True] * 3 and config.out_embed_dim == 256
    assert (config.max_source_len, config.max_seq_len, config.pad_token_id, config.decoder_start_token_id) == (
        8 - PAD - 1, 8 - PAD - 1, PAD, EOS)


@pytest.mark.parametrize("change, message", [
    ({"decoder_layers": "[(16, 3)] + [(32, 2)] + [(24, 4, 2)] + [(12, 1, 0)] + [(20, 3)]"},
     r"decoder.convolutions.1.weight has shape \(2, 16, 48\), but layer 1 of decoder_layers .* needs \(2, 16, 64\)"),
    ({"encoder_layers": "[(16, 3)] + [(24, 2)] + [(24, 3, 2)] + [(8, 1, 0)]"},
     r"encoder.convolutions.4.weight is there, but encoder_layers .* has only 4 layers"),
    ({"decoder_attention": "True"},
     r"attends at decoder layers \[0, 1, 2, 3, 4\], but the state dict has attention weights at layers \[0, 2, 4\]"),
    ({"decoder_attention": "[True, False]"}, r"decoder_attention .* one boolean per decoder layer \(5\)"),
    ({"encoder_embed_dim": 32}, r"encoder.embed_tokens.weight is 16 wide, but encoder_embed_dim is 32"),
    ({"max_target_positions": 1024}, r"decoder.embed_positions.weight has 20 rows, but max_target_positions is 1024"),
    ({"decoder_out_embed_dim": 10}, r"does not fit .*decoder_out_embed_dim 10.*decoder.fc2"),
    ({"decoder_layers": "[(16, 3)] * __import__('os').cpu_count()"}, r"decoder_layers: .* not a literal expression"),
    ({"arch": "fconv_self_att_wp"}, r"fairseq architecture 'fconv_self_att_wp'"),
    ({"share_input_output_embed": True}, r"share_input_output_embed needs out_embed_dim \(12\) equal"),
])
def test_arguments_that_disagree_with_the_state_dict_are_refused(pair, change, message):
    reference, _ = pair
    with pytest.raises(CheckpointError, match=message):
        load(reference, {**ARGS, **change})


def test_an_adaptive_softmax_is_refused(pair):
    state = {**pair[0].state_dict(), "decoder.adaptive_softmax.head.weight": torch.zeros(3, 20)}
    with pytest.raises(CheckpointError, match="adaptive softmax"):
        fconv_translation_model(dict(ARGS), state, PATH)


def test_bfloat16_weights_and_state_stay_close_to_float32(pair):
    _, model = pair
    sources, targets = [[4, 5, 6, EOS]], [[EOS, 7, 8, 9]]
    logits = []
    for m, dtype in ((model, torch.float32), (copy.deepcopy(model).to(torch.bfloat16), torch.bfloat16)):
        state = m.new_state(1, block_size=4, num_encoder_blocks=1, dtype=dtype)
        m.encode(sources, [[0]], state)
        logits.append(torch.stack(run_steps(m, state, targets, [[2, 1, 1]], [0], [[0]], [4])))
    assert logits[1].dtype == torch.float32
    torch.testing.assert_close(logits[1], logits[0], rtol=0.05, atol=0.05)


def test_the_config_comes_back_from_json_through_the_registry(pair):
    config = pair[1].config
    config_class, _ = ARCHITECTURES["fconv_seq2seq"]
    assert config_class(**json.loads(json.dumps(asdict(config)))) == config
