"""The engine's device work on (fake) CUDA: cache copies and resets, the runner's persistent buffers,
sampling, beam ranking, prompt scoring, CUDA-graph buckets, overlapped steps and the memory profile,
with no CPU tensor meeting a CUDA one (tests/fake_cuda.py).

Fake tensors hold no values, so three things are stood in for, and only these: the CUDA event that marks
the end of a step's copy to the host and the setting of a thread's current GPU (both need the CUDA
runtime; the GPUs made current are recorded), and the values that copy brings back
(`.tolist()` of a fake tensor). Each step reads back distinct, descending numbers in place of token ids,
log-probabilities and beam candidates, so the engine's bookkeeping (commits, forks, beams, stops) runs
for real and asks for the next step's device work.
"""

from __future__ import annotations

import threading

import pytest
import torch

from quill.models.loading.checkpoint import LoadedModel, resolve_device
from quill.server.engine.cache import memory
from quill.server.engine.runner import read_out
from quill.server.engine.core import CacheConfig, EngineConfig, EngineCore
from quill.server.engine.process.core_loop import CoreLoop
from quill.server.engine.scheduler import SchedulerConfig
from quill.server.sampling import SamplingParams
from tests.conftest import TINY_CONFIGS
from tests.fake_cuda import CUDA, fake_cuda, fake_model, waiting_copies
from tests.models.test_fake_cuda import model_spec
from tests.server.engine.graph_emulation import EmulatedGraphs
from tests.server.engine.helpers import run_to_completion
from tests.server.engine.test_memory import GiB, FakeCuda

pytestmark = pytest.mark.filterwarnings("ignore:PyTorch was compiled without cuDNN")  # nn.LSTM on CUDA asks

ARCHS = ["gcnn", "transformer-llama"]  # state slots, paged K,V (every architecture: tests/models/test_fake_cuda.py)


class _Event:
    """torch.cuda.Event without the CUDA runtime: the fake copy it would mark is complete at once."""

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _read_back(arrival) -> list[list[float]]:
    """Stands in for `.tolist()` of the step's fake results: each part counts down from its size."""
    return [[float(size - i) for i in range(size)] for size in arrival.sizes]


@pytest.fixture(autouse=True)
def made_current(monkeypatch) -> list[tuple[str, torch.device]]:
    """(thread name, device) of every torch.cuda.set_device, which refuses a device without an index as
    PyTorch's does."""
    calls = []

    def set_device(device):
        if isinstance(device, torch.device) and device.index is None:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        calls.append((threading.current_thread().name, device))

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    return calls


@pytest.fixture
def host_reads(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(read_out.Arrival, "wait", _read_back)


# Requests that between them ask for every kind of device work a step does.
REQUESTS = [
    ("greedy", [3, 4, 5, 6, 7, 8, 9, 10, 11, 12], SamplingParams(max_tokens=2, temperature=0, logprobs=2,
                                                                 ignore_eos=True)),
    ("n2", [3, 4, 5, 6, 7, 8], SamplingParams(max_tokens=2, n=2, temperature=0.9, top_k=5, top_p=0.9,
                                              ignore_eos=True)),  # a fork: copy-on-write, slot copies
    ("beam", [20, 21, 22, 23, 24], SamplingParams(max_tokens=3, use_beam_search=True, beam_width=3, ignore_eos=True)),
    ("penalised", [30, 31, 30], SamplingParams(max_tokens=3, temperature=0.7, min_tokens=2, repetition_penalty=1.2,
                                               presence_penalty=0.3, logit_bias={5: 2.0})),
    ("scored", [3, 4, 5, 6, 7, 8, 9], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=2, ignore_eos=True)),
]


def cuda_engine(arch: str, tokenizer, graphs: bool = False, async_scheduling: bool | None = False,
                cache: CacheConfig = CacheConfig(block_size=4, num_blocks=64),
                device: torch.device = CUDA) -> EngineCore:
    model = fake_model(*model_spec(arch), torch.bfloat16, device)
    loaded = LoadedModel(arch, None, TINY_CONFIGS[arch][0], model, tokenizer, [0], device, torch.bfloat16)
    config = EngineConfig(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32), cache,
                          enforce_eager=not graphs, async_scheduling=async_scheduling)
    return EngineCore(loaded, config, graph_capture=EmulatedGraphs() if graphs else None)


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_steps_on_cuda(arch, tiny_tokenizer, host_reads):
    with fake_cuda():
        engine = cuda_engine(arch, tiny_tokenizer)
        for request_id, prompt, params in REQUESTS:
            engine.add_request(request_id, prompt, params)
        with waiting_copies() as waiting:  # each would stall the host behind the GPU and undo overlapping
            results = run_to_completion(engine, max_steps=50)
    assert waiting == []
    finished = {r: [o["finish_reason"] for i, o in outs.items() if i != "prompt_logprobs"] for r, outs in results.items()}
    assert finished == {r: ["length"] * p.n for r, _, p in REQUESTS}
    assert len(results["scored"]["prompt_logprobs"]) == len(REQUESTS[-1][1])
    assert engine.cache.usage == 0  # every sequence's blocks or slot came back


def test_graph_buckets_and_overlapped_steps_on_cuda(tiny_tokenizer, host_reads):
    with fake_cuda():
        engine = cuda_engine("transformer-llama", tiny_tokenizer, graphs=True, async_scheduling=True)
        for i in range(3):  # plain decodes, so steps overlap and replay graph buckets; one ends after each step
            engine.add_request(f"r{i}", [3, 4, 5], SamplingParams(max_tokens=3 + i, temperature=0.8, ignore_eos=True))
        run_to_completion(engine, max_steps=50)
    assert engine.runner.graphs and engine.num_overlapped_steps > 0
    assert engine.cache.usage == 0


def test_overlapped_scheduling_is_on_by_default_on_cuda_only(tiny_tokenizer):
    with fake_cuda():
        assert cuda_engine("transformer-llama", tiny_tokenizer, async_scheduling=None).async_scheduling is True
        assert cuda_engine("transformer-llama", tiny_tokenizer, async_scheduling=False).async_scheduling is False
    cpu = cuda_engine("transformer-llama", tiny_tokenizer, async_scheduling=None, device=torch.device("cpu"))
    assert cpu.async_scheduling is False
    assert EngineCore(cpu.loaded).async_scheduling is False  # no config given: the defaults, decided the same way
    assert cuda_engine("lstm", tiny_tokenizer, async_scheduling=True, device=torch.device("cpu")).async_scheduling


def test_an_engine_on_cuda_compiles_every_attention_variant_before_serving(monkeypatch, tiny_tokenizer):
    from quill.server.engine import core as engine_core

    calls = []
    monkeypatch.setattr(engine_core, "warm_attention_variants", lambda model, block_size: calls.append(block_size))
    cuda_engine("transformer-llama", tiny_tokenizer, device=torch.device("cpu"))
    assert calls == []  # only on CUDA: elsewhere nothing is compiled
    with fake_cuda():
        cuda_engine("transformer-llama", tiny_tokenizer)
    assert calls == [4]


def test_cache_sized_by_profiling_steps_on_cuda(monkeypatch, tiny_tokenizer):
    """Without num_blocks the engine measures a prefill step, the sampler at its costliest over max_num_seqs rows
    and a graph bucket's decode step on the device (torch.cuda's memory readings stood in for by
    tests/server/engine/test_memory.py's FakeCuda)."""
    MiB = 2**20  # readings that leave the cache a few MiB of the fraction (a few thousand blocks)
    FakeCuda(monkeypatch, held=0, peak=MiB, free=80 * GiB - MiB, reserved=0)
    monkeypatch.setattr(EngineCore, "_capture_graphs", lambda *args: None)  # the sizes matter here, not graphs
    profiled = []
    for name in ("profile_step", "profile_decode_step"):
        monkeypatch.setattr(memory, name, lambda *args, step=getattr(memory, name): profiled.append(step(*args))
                            or profiled[-1])
    sampled = []
    real_sampler = memory.profile_sampler
    monkeypatch.setattr(memory, "profile_sampler", lambda *args: sampled.append(args) or real_sampler(*args))
    with fake_cuda():
        engine = cuda_engine("transformer-llama", tiny_tokenizer, graphs=True,
                             cache=CacheConfig(block_size=4, gpu_memory_utilization=1e-4))
    assert engine.state.num_blocks > 1 and engine.state.k.device == CUDA
    assert [t.device for t in profiled] == [CUDA, CUDA]
    assert sampled == [(8, engine.runner.vocab_size, CUDA)]  # max_num_seqs rows


def test_an_engine_on_cuda_without_an_index_is_built_and_stepped(tiny_tokenizer, host_reads, made_current):
    """`--device cuda` means the current GPU: nothing to make current, and nothing set_device refuses."""
    with fake_cuda():
        engine = cuda_engine("transformer-llama", tiny_tokenizer, device=torch.device("cuda"))
        CoreLoop(engine)
    assert made_current == []


def test_cuda_is_resolved_to_the_current_gpu_with_its_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert resolve_device("cuda") == resolve_device("auto") == torch.device("cuda", 3)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


def test_a_second_gpu_is_made_current_where_its_engine_is_built_and_stepped(tiny_tokenizer, host_reads, made_current):
    """Events, graph capture and Triton launches follow the thread's current GPU, not the tensors'."""
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("a real CUDA runtime refuses a second GPU that this machine does not have, even faked")
    second = torch.device("cuda", 1)
    with fake_cuda():
        engine = cuda_engine("transformer-llama", tiny_tokenizer, device=second)
        assert engine.state.k.device == second
        stepper = threading.Thread(target=CoreLoop, args=(engine,), name="stepper")
        stepper.start()
        stepper.join()
    assert made_current == [(threading.current_thread().name, second), ("stepper", second)]

