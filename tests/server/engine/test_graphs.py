"""Decode steps replayed as graphs give exactly the eager engine's answers, on every architecture.

On a CPU the graphs are emulated (tests/server/engine/graph_emulation.py): the runner's graph path runs
unchanged, only torch.cuda.graph's capture and replay are stood in for, and capture refuses what a CUDA
stream could not capture. With QUILL_TEST_DEVICE=cuda the same tests capture and replay real CUDA graphs.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace

import pytest
import torch

from quill.models.loading.checkpoint import LoadedModel
from quill.models.families.scripted import ScriptedConfig, ScriptedModel
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.conftest import KERNEL_DEVICE, TEST_DEVICE
from tests.server.engine.graph_emulation import EmulatedGraphs
from tests.server.engine.helpers import collect
from tests.server.engine.test_engine import loaded_model

ARCHS = ["lstm", "gcnn", "transformer-llama", "transformer-gpt2"]
BLOCK_SIZE = 4

# (step, request id, prompt, params): requests arrive while others decode and finish, so decode batches
# of 1 to 9 sequences replay buckets 1, 2, 4, 8 and 16 with and without padding rows.
ARRIVALS = [
    (0, "greedy", [3, 4, 5, 6, 7, 8, 9, 10, 11, 12], SamplingParams(max_tokens=14, temperature=0, ignore_eos=True)),
    (0, "seeded", [3, 4, 5, 6, 7, 8, 20, 21],
     SamplingParams(max_tokens=10, temperature=0.9, seed=11, logprobs=2, ignore_eos=True)),
    (2, "beam", [40, 41, 42, 43, 44],
     SamplingParams(max_tokens=6, use_beam_search=True, beam_width=3, ignore_eos=True)),
    (3, "n2", [60, 61, 62], SamplingParams(max_tokens=8, n=2, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)),
    (5, "penalised", list(range(60, 80)), SamplingParams(max_tokens=5, temperature=0, presence_penalty=0.5,
                                                         ignore_eos=True)),
    (6, "one-token", [50], SamplingParams(max_tokens=7, temperature=0, ignore_eos=True)),
    (9, "late", [7, 8, 9], SamplingParams(max_tokens=6, temperature=0.7, seed=3, min_tokens=3,
                                          repetition_penalty=1.2)),
]


def graph_capture(device: torch.device):
    """The capture layer under test: the engine's own CUDA graphs for a model on a GPU, else the emulation (some
    tests keep their model on the CPU whatever the test device is)."""
    return None if device.type == "cuda" else EmulatedGraphs()


def on_test_device(loaded: LoadedModel) -> LoadedModel:
    """A copy of a model some tests keep on the CPU, on the test device: on a GPU its graphs are then CUDA's own."""
    if loaded.device == TEST_DEVICE:
        return loaded
    return replace(loaded, model=copy.deepcopy(loaded.model).to(TEST_DEVICE), device=TEST_DEVICE)


def make_engine(loaded, graphs: bool, max_num_seqs: int = 16, prefix: bool = True,
                async_scheduling: bool = False) -> EngineCore:
    config = EngineConfig(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=48),
                          CacheConfig(block_size=BLOCK_SIZE, num_blocks=256, enable_prefix_caching=prefix),
                          enforce_eager=not graphs, async_scheduling=async_scheduling)
    return EngineCore(loaded, config, max_model_len=64, graph_capture=graph_capture(loaded.device) if graphs else None)


def record_replays(engine) -> list[tuple[int, int]]:
    """(real sequences, bucket) of every replayed step, from here on."""
    graphs, seen, replay = engine.runner.graphs, [], engine.runner.graphs.replay

    def recording(packed, size, fill=True):
        seen.append((len(packed.tokens), size))
        return replay(packed, size, fill)

    graphs.replay = recording
    return seen


def run_arrivals(engine, arrivals) -> dict:
    results, pending, step = {}, list(arrivals), 0
    while pending or engine.has_work():
        while pending and pending[0][0] <= step:
            _, request_id, prompt, params = pending.pop(0)
            engine.add_request(request_id, prompt, params)
        collect(results, engine.step())
        step += 1
    return results


def assert_same_answers(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for request_id, outputs in expected.items():
        for index, want in outputs.items():
            have = got[request_id][index]
            assert have["token_ids"] == want["token_ids"], (request_id, index)
            assert have["finish_reason"] == want["finish_reason"] and have["text"] == want["text"]
            assert have["cumulative_logprob"] == pytest.approx(want["cumulative_logprob"], rel=1e-4, abs=1e-4)
            if want["score"] is not None:
                assert have["score"] == pytest.approx(want["score"], rel=1e-4, abs=1e-4)
            for mine, theirs in zip(have["logprobs"], want["logprobs"], strict=True):
                assert mine.token_id == theirs.token_id and [t for t, _ in mine.top] == [t for t, _ in theirs.top]
                assert mine.logprob == pytest.approx(theirs.logprob, rel=1e-4, abs=1e-4)


@pytest.fixture(params=ARCHS)
def loaded(request, tiny_tokenizer):
    return loaded_model(request.param, tiny_tokenizer)


def test_graphs_give_the_eager_answers_for_greedy_seeded_sampling_and_beams(loaded):
    expected = run_arrivals(make_engine(loaded, graphs=False), ARRIVALS)
    engine = make_engine(loaded, graphs=True)
    assert engine.runner.graphs.sizes == [1, 2, 4, 8, 16]
    replays = record_replays(engine)
    assert_same_answers(run_arrivals(engine, ARRIVALS), expected)
    buckets = {size for _, size in replays}
    assert {1, 2, 4, 8} <= buckets, replays  # most steps are decodes, over every small bucket
    assert any(real < size for real, size in replays), replays  # with padding rows
    assert engine.cache.usage == 0


@pytest.mark.skipif(TEST_DEVICE.type != KERNEL_DEVICE.type,
                    reason="Triton kernels run on the GPU, or on the CPU in the interpreter (set only without a GPU)")
def test_graphs_with_the_triton_backend_give_the_eager_answers(tiny_tokenizer):
    def triton_model():
        loaded = loaded_model("transformer-llama", tiny_tokenizer)
        loaded.model.attention_backend = "triton"
        return loaded

    arrivals = [  # greedy, seeded sampling, beams, kept short: the interpreter is slow
        (0, "greedy", [3, 4, 5, 6, 7], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)),
        (0, "seeded", [3, 4, 20], SamplingParams(max_tokens=2, temperature=0.9, seed=11, ignore_eos=True)),
        (1, "beam", [40, 41], SamplingParams(max_tokens=2, use_beam_search=True, beam_width=2, ignore_eos=True)),
    ]
    expected = run_arrivals(make_engine(triton_model(), graphs=False), arrivals)
    engine = make_engine(triton_model(), graphs=True, max_num_seqs=4)
    assert engine.state.attention.name == "triton"
    replays = record_replays(engine)
    assert_same_answers(run_arrivals(engine, arrivals), expected)
    assert any(real < size for real, size in replays), replays


def changed_rows(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    """Indices along the first dimension where two tensors differ."""
    return set((before != after).flatten(1).any(1).nonzero().flatten().tolist())


def test_padding_rows_write_only_the_scratch_block_or_slot(loaded):
    engine = make_engine(loaded, graphs=True, prefix=False)  # no snapshot copies into spare slots
    for i in range(3):  # three sequences decoding: a bucket of 4 with one padding row
        engine.add_request(f"r{i}", [5 + i, 6, 7, 8, 9][: 3 + i], SamplingParams(max_tokens=5, temperature=0,
                                                                                 ignore_eos=True))
    engine.step()  # the prompts, eagerly
    replays = record_replays(engine)
    seqs = [g.seqs[0] for g in engine.groups.values()]
    state = engine.state
    paged = loaded.model.state_kind == "paged_kv"
    if paged:  # (num_blocks, ...) per layer
        tensors = {"k": state.k.transpose(0, 1), "v": state.v.transpose(0, 1)}
        scratch = engine.cache.num_blocks  # the first block past those the manager hands out
    else:
        tensors = state.tensors
        scratch = len(engine.cache.free_slots) + len(engine.cache.slots) + len(engine.cache.free_snapshot_slots)
    before = {name: t.clone() for name, t in tensors.items()}
    engine.step()
    assert replays == [(3, 4)]
    if paged:  # the block each sequence's new token (now its last computed one) went to
        written = {engine.cache.block_table(s.seq_id)[(s.num_computed - 1) // BLOCK_SIZE] for s in seqs}
    else:
        written = {engine.cache.slot(s.seq_id) for s in seqs}
    for name, t in tensors.items():
        changed = changed_rows(before[name], t)
        assert scratch in changed  # the padding row wrote its state there
        assert changed - {scratch} <= written, name  # and nothing else but the real sequences changed
    assert scratch == (state.num_blocks if paged else state.num_slots) - 1  # the state's one extra block or slot


def test_a_step_that_cannot_be_captured_leaves_the_engine_eager(tiny_tokenizer, caplog):
    def reads_the_host(tokens, positions):  # .item() syncs with the device: no graph can hold it
        return torch.nn.functional.one_hot((tokens + int(positions.max().item())) % 50, 300).float()

    model = ScriptedModel(ScriptedConfig(tiny_tokenizer.vocab_size, state_kind="slots"), logits_fn=reads_the_host)
    loaded = LoadedModel("scripted", None, "scripted", model.to(TEST_DEVICE), tiny_tokenizer, [0], TEST_DEVICE,
                         torch.float32)
    with caplog.at_level(logging.WARNING, logger="quill.engine"):
        engine = make_engine(loaded, graphs=True)
    assert engine.runner.graphs.sizes == [] and not engine.runner.graphs
    assert "run eagerly" in caplog.text
    engine.add_request("a", [1, 2], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    results = run_arrivals(engine, [])
    assert results["a"][0]["token_ids"] == [3, 5, 8]  # (last token + its position) % 50


def test_no_graphs_on_the_cpu_by_default_nor_with_enforce_eager(tiny_tokenizer):
    loaded = loaded_model("gcnn", tiny_tokenizer)
    config = EngineConfig(SchedulerConfig(max_num_seqs=4))
    if TEST_DEVICE.type == "cpu":
        default = EngineCore(loaded, config)
        assert default.runner.graphs.sizes == [] and default.graph_bytes == 0
        assert default.state.num_slots == default.cache.num_seq_slots * 3  # no scratch slot either
    config.enforce_eager = True
    forced = EngineCore(loaded, config, graph_capture=EmulatedGraphs())
    assert forced.runner.graphs.sizes == []


def test_capture_is_logged_with_its_sizes_time_and_memory(tiny_tokenizer, caplog):
    with caplog.at_level(logging.INFO, logger="quill.engine"):
        make_engine(loaded_model("lstm", tiny_tokenizer), graphs=True, max_num_seqs=4)
    assert "captured decode graphs for batches of 1, 2, 4 sequences in" in caplog.text and "MiB" in caplog.text


def test_a_capture_failing_at_one_batch_size_drops_every_graph_and_names_that_size(tiny_tokenizer, caplog):
    class FailsAtSecond(EmulatedGraphs):  # the largest bucket captures, the next one fails
        def capture(self, step):
            self.captured = getattr(self, "captured", 0) + 1
            if self.captured == 2:
                raise RuntimeError("operation not permitted when stream is capturing")
            return super().capture(step)

    loaded = loaded_model("lstm", tiny_tokenizer)
    capture = FailsAtSecond()
    config = EngineConfig(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=48),
                          CacheConfig(block_size=BLOCK_SIZE, num_blocks=256), async_scheduling=False)
    with caplog.at_level(logging.WARNING, logger="quill.engine"):
        engine = EngineCore(loaded, config, max_model_len=64, graph_capture=capture)
    assert capture.released and not engine.runner.graphs and engine.runner.graphs.sizes == []
    assert engine.graph_bytes == 0
    assert "a batch of 8 sequences as a CUDA graph failed (operation not permitted" in caplog.text  # 16, then 8
    engine.add_request("a", [1, 2], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(run_arrivals(engine, [])["a"][0]["token_ids"]) == 3  # eagerly
