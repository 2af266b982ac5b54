"""OpenNMT-py's recurrent encoder-decoder (quill/models/families/rnn_seq2seq.py) against a reference written here
from the equations (Luong et al. 2015's global attention and input feeding, Bahdanau et al. 2015's additive score),
run a whole sequence at a time without any incremental state; and its `.pt` checkpoints in each vocabulary form
(quill/models/classic/opennmt.py), written here with stand-ins for torchtext's and OpenNMT's classes."""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import sys
import types
from collections import Counter, defaultdict

import pytest
import torch
from torch import nn

from quill.models.batch import StepBatch
from quill.models.classic.opennmt import convert, detect
from quill.models.families.rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqConfig
from quill.models.loading.errors import CheckpointError

BLOCK = 4
SOURCES = [[5, 9, 3, 7, 11, 4, 8], [6, 12], [13, 4, 21, 7, 9]]
TARGETS = [[2, 8, 14, 9, 3], [2, 17, 5, 6, 10], [2, 4, 4, 19, 7]]
SLOTS = [3, 0, 5]


def tiny_model(seed: int = 0, **overrides) -> RNNSeq2Seq:
    options = dict(vocab_size=30, source_vocab_size=25, hidden_size=8, layers=1, source_embed_dim=6,
                   target_embed_dim=7, decoder_start_token_id=2, pad_token_id=1)
    torch.manual_seed(seed)
    model = RNNSeq2Seq(RNNSeq2SeqConfig(**{**options, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.6, 0.6)
    return model.eval()


# The reference: every equation written out, one sequence at a time, from the model's parameters by name.

def cell(kind: str, weights: list[torch.Tensor], x: torch.Tensor, state: tuple) -> tuple:
    w_ih, w_hh, b_ih, b_hh = weights
    if kind == "LSTM":
        h, c = state
        i, f, g, o = (x @ w_ih.T + b_ih + h @ w_hh.T + b_hh).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    (h,) = state
    xr, xz, xn = (x @ w_ih.T + b_ih).chunk(3, -1)
    hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, -1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    return ((1 - z) * torch.tanh(xn + r * hn) + z * h,)


def reference_encoder(p: dict, c: RNNSeq2SeqConfig, source: list[int]):
    """-> the memory bank (S, H) and the decoder's initial state: per layer, (h, c) or (h,) each (H,)."""
    x = p["src_embed.weight"][source]
    dirs, width = c.directions, c.hidden_size // c.directions
    finals = []  # in (layer, direction) order
    for layer in range(c.layers):
        outputs = []
        for d in range(dirs):
            names = [f"encoder.{w}_l{layer}{'_reverse' if d else ''}" for w in ("weight_ih", "weight_hh", "bias_ih",
                                                                              "bias_hh")]
            state = tuple(torch.zeros(width) for _ in range(2 if c.rnn_type == "LSTM" else 1))
            out = [None] * len(source)
            for j in (reversed(range(len(source))) if d else range(len(source))):
                state = cell(c.rnn_type, [p[n] for n in names], x[j], state)
                out[j] = state[0]
            finals.append(state)
            outputs.append(torch.stack(out))
        x = torch.cat(outputs, -1)
    per_kind = [torch.stack([f[k] for f in finals]) for k in range(len(finals[0]))]  # (layers * dirs, width)
    if c.bridge:  # each kind's states flattened in (layer, direction) order, cut into rows of layers * width
        per_kind = [torch.relu(s.reshape(-1, c.layers * width) @ p[f"bridge.{k}.weight"].T + p[f"bridge.{k}.bias"])
                    .reshape(s.shape) for k, s in enumerate(per_kind)]
    start = [tuple(s[layer * dirs:(layer + 1) * dirs].flatten() for s in per_kind) for layer in range(c.layers)]
    return x, start


def reference_attention(p: dict, kind: str, h: torch.Tensor, memory: torch.Tensor) -> tuple:
    """-> the attentional output and the weights over the memory bank (None without attention)."""
    if kind == "none":
        return h, None
    if kind == "dot":
        scores = memory @ h
    elif kind == "general":
        scores = memory @ (p["attn.linear_in.weight"] @ h)
    else:  # Bahdanau: v . tanh(W_q h + b_q + U h_j)
        query = p["attn.linear_query.weight"] @ h + p["attn.linear_query.bias"]
        scores = torch.tanh(query + memory @ p["attn.linear_context.weight"].T) @ p["attn.v.weight"][0]
    weights = torch.softmax(scores, 0)
    out = p["attn.linear_out.weight"] @ torch.cat([weights @ memory, h])
    return (out + p["attn.linear_out.bias"] if kind == "mlp" else torch.tanh(out)), weights


def reference(model: RNNSeq2Seq, source: list[int], target: list[int], alignment: list | None = None) -> torch.Tensor:
    """(len(target), vocab) log-probabilities of each next token; each token's attention weights over the source
    appended to `alignment` where given."""
    p, c = dict(model.state_dict()), model.config
    memory, states = reference_encoder(p, c, source)
    feed, rows = torch.zeros(c.hidden_size), []
    for token in target:
        x = p["tgt_embed.weight"][token]
        x = torch.cat([x, feed]) if c.input_feed else x
        for layer in range(c.layers):
            if c.input_feed:
                names = [f"decoder.{layer}.{w}" for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            else:
                names = [f"decoder.{w}_l{layer}" for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            states[layer] = cell(c.rnn_type, [p[n] for n in names], x, states[layer])
            x = states[layer][0]
        feed, weights = reference_attention(p, c.global_attention, x, memory)
        if alignment is not None:
            alignment.append(weights)
        weight = p["tgt_embed.weight"] if c.share_decoder_embeddings else p["generator.weight"]
        rows.append(torch.log_softmax(weight @ feed + p["generator_bias"], 0))
    return torch.stack(rows)


# Quill, incrementally.

def tables_for(model: RNNSeq2Seq) -> list[list[int]]:
    """Each source's blocks, out of order and apart: its rows, then its decoder's initial state."""
    free = [9, 2, 14, 5, 0, 11, 7, 16, 3, 12, 6, 15, 1]
    tables = []
    for source in SOURCES:
        need = -(-(len(source) + model.encoder_state_rows) // BLOCK)
        tables.append([free.pop(0) for _ in range(need)])
    return tables


def fresh_state(model: RNNSeq2Seq):
    state = model.new_state(6, block_size=BLOCK, num_encoder_blocks=17)
    for tensor in state.slots.tensors.values():  # a reused slot's leftovers: position 0 must not read them
        tensor.normal_()
    state.encoder.k.normal_()
    state.encoder.v.normal_()
    model.encode(SOURCES, tables_for(model), state)
    return state


def step_batch(model, seqs: list[int], chunks: list[list[int]], starts: list[int]) -> StepBatch:
    tables = tables_for(model)
    batch = StepBatch.build(chunks, starts, slots=[SLOTS[s] for s in seqs], logits="all")
    width = max(len(tables[s]) for s in seqs)
    batch.cross_tables = torch.tensor([tables[s] + [0] * (width - len(tables[s])) for s in seqs])
    batch.cross_lens = torch.tensor([len(SOURCES[s]) for s in seqs])
    return batch


def run_step(model, state, seqs: list[int], chunks: list[list[int]], starts: list[int]) -> list[torch.Tensor]:
    batch = step_batch(model, seqs, chunks, starts)
    return list(model.step(batch, state).split([len(chunk) for chunk in chunks]))


def token_by_token(model) -> list[torch.Tensor]:
    state, out = fresh_state(model), [[] for _ in SOURCES]
    for t in range(len(TARGETS[0])):
        rows = run_step(model, state, [0, 1, 2], [[target[t]] for target in TARGETS], [t, t, t])
        for s, row in enumerate(rows):
            out[s].append(row)
    return [torch.cat(rows) for rows in out]


CHUNKS = [([0, 1, 2], [(0, 3), (0, 1), (0, 5)]), ([1, 0], [(1, 2), (3, 5)]), ([1], [(2, 5)])]  # (seqs, spans)


def in_chunks(model) -> list[torch.Tensor]:
    """Several tokens a step, sequences of a step at different lengths and positions."""
    state, out = fresh_state(model), [[] for _ in SOURCES]
    for seqs, spans in CHUNKS:
        rows = run_step(model, state, seqs, [TARGETS[s][a:b] for s, (a, b) in zip(seqs, spans)],
                        [a for a, _ in spans])
        for s, row in zip(seqs, rows):
            out[s].append(row)
    return [torch.cat(rows) for rows in out]


def assert_matches_reference(model: RNNSeq2Seq) -> None:
    with torch.no_grad():
        expected = [reference(model, source, target) for source, target in zip(SOURCES, TARGETS)]
    for got in (token_by_token(model), in_chunks(model)):
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


MATRIX = list(itertools.product(["LSTM", "GRU"], [False, True], ["dot", "general", "mlp"], [True, False], [1, 2]))


@pytest.mark.parametrize("rnn_type,bidirectional,attention,input_feed,layers", MATRIX)
def test_steps_equal_the_reference(rnn_type, bidirectional, attention, input_feed, layers):
    assert_matches_reference(tiny_model(rnn_type=rnn_type, bidirectional=bidirectional, global_attention=attention,
                                        input_feed=input_feed, layers=layers))


@pytest.mark.parametrize("attention,input_feed", [("dot", True), ("mlp", False), ("general", True)])
def test_alignment_sums_the_attention_over_each_steps_tokens(attention, input_feed):
    """StepBatch.alignment (what the coverage penalty sums): each sequence's attention weights over its source,
    summed over its new tokens, zero past its source; chunks of different lengths in one step."""
    model = tiny_model(global_attention=attention, input_feed=input_feed, bidirectional=True, layers=2)
    assert model.aligns
    expected = []
    with torch.no_grad():
        for source, target in zip(SOURCES, TARGETS):
            weights: list = []
            reference(model, source, target, weights)
            expected.append(torch.stack(weights))  # (target tokens, source tokens)
    state = fresh_state(model)
    for seqs, spans in CHUNKS:
        batch = step_batch(model, seqs, [TARGETS[s][a:b] for s, (a, b) in zip(seqs, spans)], [a for a, _ in spans])
        batch.want_alignment = True
        model.step(batch, state)
        assert batch.alignment.shape == (len(seqs), max(len(SOURCES[s]) for s in seqs))
        for row, (s, (a, b)) in enumerate(zip(seqs, spans)):
            n = len(SOURCES[s])
            torch.testing.assert_close(batch.alignment[row, :n], expected[s][a:b].sum(0), rtol=1e-5, atol=1e-5)
            assert not batch.alignment[row, n:].any()
    assert not tiny_model(global_attention="none").aligns


@pytest.mark.parametrize("options", [
    dict(bridge=True, bidirectional=True, layers=2),
    dict(bridge=True, rnn_type="GRU", layers=2),
    dict(global_attention="none"),
    dict(share_decoder_embeddings=True, target_embed_dim=8, hidden_size=8),
])
def test_bridge_no_attention_and_shared_generator_equal_the_reference(options):
    assert_matches_reference(tiny_model(**options))


def test_narrowed_weights_answer_as_float32_over_rounded_weights():
    """bfloat16 linear weights under float32 arithmetic (a CPU without bfloat16's): the attention's and generator's
    weights, which the model reads itself, are widened like the rest."""
    from quill.models.kernels import TORCH_OPS
    from quill.models.kernels.narrow_weights import narrow_linear_weights
    from quill.models.kernels.ops_linear import route_linears

    narrowed, rounded = (tiny_model(global_attention="general", layers=2) for _ in range(2))
    for model in (narrowed, rounded):
        route_linears(model, TORCH_OPS)
    assert narrow_linear_weights(narrowed) > 0
    with torch.no_grad():
        for module in rounded.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(module.weight.bfloat16().float())
    with torch.inference_mode():
        for got, expected in zip(token_by_token(narrowed), token_by_token(rounded)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options, refused", [
    (dict(global_attention_function="sparsemax"), "softmax only"),
    (dict(source_features=1), "word features"),
    (dict(position_encoding=True), "position_encoding"),
    (dict(rnn_type="SRU"), "rnn_type"),
])
def test_what_the_model_does_not_run_is_refused(options, refused):
    with pytest.raises(ValueError, match=refused):
        tiny_model(**options)


# OpenNMT-py's checkpoints, written here as each version saves them.

SPECIAL = ["<unk>", "<blank>", "<s>", "</s>"]
SOURCE_TOKENS = SPECIAL + [f"s{i}" for i in range(21)]
TARGET_TOKENS = SPECIAL[:2] + ["<s>", "</s>"] + [f"t{i}" for i in range(26)]


class Vocab:  # torchtext.vocab.Vocab, its attributes as OpenNMT's __getstate__ pickles them
    pass


class Field:  # torchtext.data.field.Field
    pass


class TextMultiField:  # onmt.inputters.text_dataset.TextMultiField
    pass


class Optimizer:  # onmt.utils.optimizers.Optimizer, which no checkpoint of 1.0 or later holds
    pass


def _feature_tokenize(string, layer=0, tok_delim=None, feat_delim=None, truncate=None):
    return string.split(tok_delim)


def _default_unk_index():
    return 0


STAND_INS = {"torchtext.vocab": {"Vocab": Vocab, "_default_unk_index": _default_unk_index},
             "torchtext.data.field": {"Field": Field},
             "onmt.inputters.text_dataset": {"TextMultiField": TextMultiField, "_feature_tokenize": _feature_tokenize},
             "onmt.utils.optimizers": {"Optimizer": Optimizer}}
for _module, _members in STAND_INS.items():  # so pickle records them by those names
    for _name, _member in _members.items():
        _member.__module__, _member.__qualname__ = _module, _name


@pytest.fixture
def stand_ins(monkeypatch):
    """The stand-ins importable under torchtext's and OpenNMT's names while the test pickles them."""
    for module_name, members in STAND_INS.items():
        parts = module_name.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        for member_name, member in members.items():
            monkeypatch.setattr(sys.modules[module_name], member_name, member, raising=False)


def make(cls, **attributes):
    obj = cls()
    obj.__dict__.update(attributes)
    return obj


def torchtext_vocab(tokens: list[str], legacy_stoi: bool = False) -> Vocab:
    stoi = {t: i for i, t in enumerate(tokens)}
    if legacy_stoi:  # torchtext 0.3 pickled its defaultdict as it was
        stoi = defaultdict(_default_unk_index, stoi)
    return make(Vocab, itos=list(tokens), stoi=stoi, freqs=Counter(tokens[4:]), unk_index=0, vectors=None)


def field(tokens: list[str], bos: str | None, eos: str | None, **vocab_options) -> Field:
    tokenize = functools.partial(_feature_tokenize, layer=0, truncate=None, feat_delim=None)
    return make(Field, sequential=True, use_vocab=True, init_token=bos, eos_token=eos, unk_token="<unk>",
                pad_token="<blank>", fix_length=None, dtype="int64", preprocessing=None, postprocessing=None,
                lower=False, tokenizer_args=(tokenize, "en"), tokenize=tokenize, include_lengths=bos is None,
                batch_first=False, pad_first=False, truncate_first=False, stop_words=None, is_target=False,
                vocab=torchtext_vocab(tokens, **vocab_options))


def vocab_in_form(form: str, source=SOURCE_TOKENS, target=TARGET_TOKENS):
    if form == "v3":
        return {"src": list(source), "tgt": list(target), "data_task": "seq2seq", "decoder_start_token": "<s>"}
    if form == "v2":  # v1 and v2: a dict of TextMultiFields
        def multi(name, f):
            return make(TextMultiField, preprocessing=None, postprocessing=None, is_target=False, fields=[(name, f)])
        indices = make(Field, sequential=False, use_vocab=False, dtype="int64", tokenize=None,
                       tokenizer_args=(None, "en"))
        return {"src": multi("src", field(source, None, None)), "tgt": multi("tgt", field(target, "<s>", "</s>")),
                "indices": indices}
    if form == "nested":  # {"src": [(name, Field)], ...}
        return {"src": [("src", field(source, None, None))], "tgt": [("tgt", field(target, "<s>", "</s>"))]}
    if form == "field_pairs":
        return [("src", field(source, None, None)), ("tgt", field(target, "<s>", "</s>"))]
    assert form == "vocab_pairs"  # the oldest: [(name, Vocab)], torchtext 0.3's defaultdict in it
    return [("src", torchtext_vocab(source, legacy_stoi=True)), ("tgt", torchtext_vocab(target, legacy_stoi=True))]


def opennmt_state(model: RNNSeq2Seq, generator_prefix: str) -> tuple[dict, dict]:
    """The model's tensors under OpenNMT-py's names: (model, generator)."""
    renames = [("src_embed.", "encoder.embeddings.make_embedding.emb_luts.0."),
               ("tgt_embed.", "decoder.embeddings.make_embedding.emb_luts.0."), ("encoder.", "encoder.rnn."),
               ("bridge.", "encoder.bridge."), ("attn.", "decoder.attn."),
               ("decoder.", "decoder.rnn.layers." if model.config.input_feed else "decoder.rnn.")]
    state, generator = {}, {}
    for key, tensor in model.state_dict().items():
        if key.startswith("generator"):
            generator[generator_prefix + ("bias" if key == "generator_bias" else "weight")] = tensor.clone()
            continue
        prefix, to = next((p, t) for p, t in renames if key.startswith(p))
        state[to + key[len(prefix):]] = tensor.clone()
    if model.config.share_decoder_embeddings:
        generator[generator_prefix + "weight"] = model.tgt_embed.weight.clone()
    return state, generator


def options(model: RNNSeq2Seq, version: str, **changes) -> argparse.Namespace:
    c = model.config
    size = "hidden_size" if version == "v3" else "rnn_size"
    opt = {"model_type": "text", "encoder_type": "brnn" if c.bidirectional else "rnn", "decoder_type": "rnn",
           "rnn_type": c.rnn_type, "layers": c.layers, "enc_layers": 2, "dec_layers": 2, size: c.hidden_size,
           "word_vec_size": -1, "src_word_vec_size": c.source_embed_dim, "tgt_word_vec_size": c.target_embed_dim,
           "global_attention": c.global_attention, "global_attention_function": "softmax",
           "input_feed": int(c.input_feed), "bridge": c.bridge, "copy_attn": False, "context_gate": None,
           "coverage_attn": False, "share_decoder_embeddings": c.share_decoder_embeddings, "position_encoding": False,
           "generator_function": "softmax", "dropout": [0.3], "transforms": ["filtertoolong"],
           "_all_transform": {"filtertoolong"}}
    return argparse.Namespace(**{**opt, **changes})


def save(path, model, form: str, vocab=None, **opt_changes):
    version = "v3" if form == "v3" else "v2"
    state, generator = opennmt_state(model, "" if version == "v3" else "0.")
    optim = {"optimizer": {"state": {}, "param_groups": [{"lr": 1.0}]}, "training_step": 10}
    torch.save({"model": state, "generator": generator, "vocab": vocab or vocab_in_form(form),
                "opt": options(model, version, **opt_changes), "optim": optim}, path)
    return path


FORMS = ["v3", "v2", "nested", "field_pairs", "vocab_pairs"]


@pytest.mark.parametrize("form", FORMS)
def test_checkpoint_of_each_vocab_form_gives_the_reference(tmp_path, stand_ins, form):
    model = tiny_model(3, rnn_type="GRU" if form == "nested" else "LSTM", bidirectional=True, layers=2,
                       global_attention="mlp" if form == "v2" else "general", input_feed=form != "field_pairs")
    path = save(tmp_path / "model_step_100.pt", model, form)
    assert detect(path) and detect(tmp_path)
    converted = convert(path, None)
    assert converted.architecture == "rnn_seq2seq" and converted.tokenizer is None
    tokenizer = converted.seq2seq_tokenizer
    assert tokenizer["source_vocab"] == SOURCE_TOKENS and tokenizer["target_vocab"] == TARGET_TOKENS
    assert tokenizer["specials"] == {"unk": "<unk>", "pad": "<blank>", "bos": "<s>", "eos": "</s>"}
    assert tokenizer["source_suffix"] == [] and tokenizer["sentencepiece"] is None and tokenizer["bpe_codes"] is None
    loaded = converted.model
    assert loaded.config.decoder_start_token_id == 2 and loaded.config.pad_token_id == 1
    with torch.no_grad():
        expected = [reference(model, s, t) for s, t in zip(SOURCES, TARGETS)]
    for got, e in zip(token_by_token(loaded), expected):
        torch.testing.assert_close(got, e, rtol=1e-5, atol=1e-5)


def test_shared_generator_and_coverage_weight(tmp_path):
    model = tiny_model(4, share_decoder_embeddings=True, target_embed_dim=8)
    path = save(tmp_path / "m.pt", model, "v3", coverage_attn=True)
    state, generator = opennmt_state(model, "")
    state["decoder.attn.linear_cover.weight"] = torch.zeros(8, 1)
    torch.save({"model": state, "generator": generator, "vocab": vocab_in_form("v3"),
                "opt": options(model, "v3", coverage_attn=True)}, path)
    converted = convert(path, None)
    assert converted.model.generator is None
    assert converted.metadata["dropped_tensors"] == ["decoder.attn.linear_cover.weight"]
    torch.testing.assert_close(token_by_token(converted.model)[0], reference(model, SOURCES[0], TARGETS[0]),
                               rtol=1e-5, atol=1e-5)


def test_a_foreign_callable_is_refused_by_name(tmp_path):
    model = tiny_model(5)
    path = save(tmp_path / "m.pt", model, "v3", on_load=os.system)
    with pytest.raises(CheckpointError, match=r"needs .*(posix|os)\.system"):
        convert(path, None)


def test_an_unlisted_class_is_refused_by_name(tmp_path, stand_ins):
    model = tiny_model(5)
    path = tmp_path / "m.pt"
    state, generator = opennmt_state(model, "0.")
    torch.save({"model": state, "generator": generator, "vocab": vocab_in_form("v2"), "opt": options(model, "v2"),
                "optim": make(Optimizer, lr=1.0)}, path)
    with pytest.raises(CheckpointError, match=r"onmt\.utils\.optimizers\.Optimizer"):
        convert(path, None)


@pytest.mark.parametrize("form", ["v3", "v2"])
def test_a_vocabulary_that_disagrees_with_the_embeddings_is_refused(tmp_path, stand_ins, form):
    model = tiny_model(6)
    path = save(tmp_path / "m.pt", model, form, vocab=vocab_in_form(form, target=TARGET_TOKENS[:-1]))
    with pytest.raises(CheckpointError, match=r"target vocabulary has 29 tokens, but the decoder's embeddings"):
        convert(path, None)


@pytest.mark.parametrize("changes, named", [
    (dict(rnn_size=16), "enc_hid_size 16"),
    (dict(rnn_type="GRU"), "rnn_type 'GRU'"),
    (dict(encoder_type="brnn"), "brnn True"),
    (dict(input_feed=0), "input_feed False"),
    (dict(global_attention="dot"), "global_attention 'dot'"),
    (dict(encoder_type="transformer"), "encoder_type 'transformer'"),
    (dict(copy_attn=True), "copy_attn"),
    (dict(global_attention_function="sparsemax"), "softmax only"),
    (dict(generator_function="sparsemax"), "generator_function 'sparsemax'"),
    (dict(position_encoding=True), "position_encoding"),
])
def test_options_that_disagree_with_the_weights_or_the_model_are_refused(tmp_path, stand_ins, changes, named):
    model = tiny_model(7)
    path = save(tmp_path / "m.pt", model, "v2", **changes)
    with pytest.raises(CheckpointError, match=named):
        convert(path, None)


def test_word_features_are_refused(tmp_path):
    model = tiny_model(8)
    vocab = {**vocab_in_form("v3"), "src_feats": [["<unk>", "N", "V"]]}
    with pytest.raises(CheckpointError, match="word features"):
        convert(save(tmp_path / "m.pt", model, "v3", vocab=vocab), None)
