"""How many bytes the K,V cache gets: given, or sized from the GPU (vLLM's --gpu-memory-utilization).

On CUDA, after the weights are loaded, one profiling step at the largest batch the scheduler may pack
(max_num_batched_tokens new tokens, logits for every row, as a step with prompt logprobs computes)
measures the activations' peak, and the sampler at its costliest over max_num_seqs rows (penalties' token
counts, top-k, top-p's sort, min-p, top log-probabilities: several batch x vocabulary copies) another; the
larger counts, since the model's activations are freed before a step samples. The cache then takes what is
left of `utilization` x the device's memory once the weights, that peak and the memory outside PyTorch's
allocator (the CUDA context, other processes) are counted. The arithmetic is `kv_cache_bytes`, a pure function.

CUDA graphs are reserved for here, before the cache is sized, rather than measured after: they are
captured over the cache's own tensors, so they can only exist once the cache does, and a cache already
allocated cannot shrink to make room. Their memory is a private pool that eager steps never reuse,
holding about one decode step's activations at the largest graph batch (smaller graphs share it), so
a second profiling step, that decode step, measures what to set aside. The engine logs what capture took.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch

from quill.models.batch import StepBatch
from quill.models.state import new_model_state, state_parts
from quill.server.sampling import SamplingParams
from quill.server.sampling.sampler import sample
from quill.server.sampling.table import build_batch

DEFAULT_CACHE_BYTES = 256 * 2**20  # off CUDA, when no size is given


@dataclass(frozen=True, slots=True)
class GpuMemory:
    total: int  # the device's memory
    weights: int  # the model's parameters and buffers
    peak_activations: int  # what a step at the largest batch allocates on top of what was held before it
    non_torch: int  # in use on the device outside PyTorch's allocator
    graphs: int = 0  # the CUDA graphs' memory pool: a decode step's activations at the largest graph batch


def kv_cache_bytes(memory: GpuMemory, utilization: float) -> int:
    """What is left for the K,V cache of `utilization` x the device's memory; ValueError if nothing is."""
    budget = int(memory.total * utilization)
    taken = memory.weights + memory.peak_activations + memory.graphs + memory.non_torch
    if taken >= budget:
        gib = 2**30
        raise ValueError(
            f"no memory left for the K,V cache: {utilization:g} of {memory.total / gib:.2f} GiB is "
            f"{budget / gib:.2f} GiB, and the weights ({memory.weights / gib:.2f} GiB), a step's activations "
            f"({memory.peak_activations / gib:.2f} GiB), CUDA graphs ({memory.graphs / gib:.2f} GiB) and memory "
            f"outside PyTorch ({memory.non_torch / gib:.2f} GiB) take all of it; raise --gpu-memory-utilization, "
            "lower --max-num-batched-tokens or --max-num-seqs, pass --enforce-eager or give --cache-bytes"
        )
    return budget - taken


def choose_cache_bytes(model, cache_bytes: int | None, gpu_memory_utilization: float, block_size: int,
                       max_num_batched_tokens: int, max_model_len: int, graph_batch_size: int = 0,
                       max_num_seqs: int = 0) -> int:
    """`cache_bytes` when given; else sized from the GPU on CUDA, DEFAULT_CACHE_BYTES elsewhere.
    `graph_batch_size`: the largest batch CUDA graphs will be captured for (0: none); `max_num_seqs`: the rows
    the sampler may get (0: not profiled)."""
    if cache_bytes is not None:
        return cache_bytes
    if _device(model).type != "cuda":
        return DEFAULT_CACHE_BYTES
    memory = measure_gpu_memory(model, block_size, max_num_batched_tokens, max_model_len, graph_batch_size,
                                max_num_seqs)
    return kv_cache_bytes(memory, gpu_memory_utilization)


def _device(model) -> torch.device:
    return next(chain(model.parameters(), model.buffers())).device


def profile_prompts(max_num_batched_tokens: int, max_model_len: int) -> list[int]:
    """The prompt lengths of `profile_step`: `max_num_batched_tokens` new tokens in prompts of at most
    `max_model_len` (learned positions end there)."""
    full, rest = divmod(max_num_batched_tokens, max_model_len)
    return [max_model_len] * full + [rest] * (rest > 0)


def profile_blocks(max_num_batched_tokens: int, max_model_len: int, block_size: int) -> int:
    """Blocks `profile_step` needs."""
    return sum(-(-n // block_size) for n in profile_prompts(max_num_batched_tokens, max_model_len))


def profile_step(model, state, max_num_batched_tokens: int, max_model_len: int) -> torch.Tensor:
    """One step of `profile_prompts`, with logits for every row; `state` must hold them all (a hybrid's: a slot
    per prompt)."""
    kv, slots = state_parts(state)  # a hybrid model holds slots beside its K,V
    prompts, tables, next_block = [], [], 0
    for n in profile_prompts(max_num_batched_tokens, max_model_len):
        num_blocks = -(-n // kv.block_size)
        prompts.append([0] * n)
        tables.append(list(range(next_block, next_block + num_blocks)))
        next_block += num_blocks
    batch = StepBatch.build(prompts, [0] * len(prompts), block_tables=tables, logits="all",
                            slots=None if slots is None else list(range(len(prompts))),
                            device=kv.k.device)
    logits = model.step(batch, state)  # (max_num_batched_tokens, V)
    return torch.log_softmax(logits, dim=-1)  # prompt scoring holds a second copy


def profile_decode_step(model, state, batch_size: int, max_model_len: int) -> torch.Tensor:
    """The step a CUDA graph of `batch_size` sequences runs: one token each, block tables as wide as the
    longest sequence, logits for every row. Every row reads block 0 only; `state` needs one block."""
    kv, slots = state_parts(state)
    device = kv.k.device
    width = -(-max_model_len // kv.block_size)
    zeros = torch.zeros(batch_size, dtype=torch.long, device=device)
    batch = StepBatch(token_ids=zeros, positions=zeros, query_lens=[1] * batch_size,
                      block_tables=torch.zeros(batch_size, width, dtype=torch.long, device=device),
                      slots=None if slots is None else zeros)  # a hybrid's rows all read slot 0
    return model.step(batch, state)  # (batch_size, V)


# The sampler's costliest settings: every filter, penalties (a batch x vocabulary count each), 20 top logprobs.
COSTLIEST_SAMPLING = SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                                    presence_penalty=0.5, frequency_penalty=0.5, logprobs=20)


def profile_sampler(num_rows: int, vocab_size: int, device: torch.device) -> None:
    """The sampler over `num_rows` rows of float32 logits (made here, as a decode step's are) at its costliest."""
    rows = range(num_rows)
    batch = build_batch([COSTLIEST_SAMPLING] * num_rows, [[0] for _ in rows], [[0] for _ in rows], [None] * num_rows,
                        vocab_size, device)
    sample(torch.zeros(num_rows, vocab_size, device=device), batch)


def measure_gpu_memory(model, block_size: int, max_num_batched_tokens: int, max_model_len: int,
                       graph_batch_size: int = 0, max_num_seqs: int = 0) -> GpuMemory:
    """The figures `kv_cache_bytes` needs, read from the CUDA device the model is on."""
    device = _device(model)
    weights = sum(t.numel() * t.element_size() for t in chain(model.parameters(), model.buffers()))
    num_prompts = len(profile_prompts(max_num_batched_tokens, max_model_len))  # a hybrid's slot each
    state = new_model_state(model, profile_blocks(max_num_batched_tokens, max_model_len, block_size), num_prompts,
                            block_size)

    def peak_of(step) -> int:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        held = torch.cuda.memory_allocated(device)  # weights, earlier models, the profiling cache
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - held

    scored = []  # the profiling step's log-probabilities: the sampler's rows are as wide, on the same device
    peak = peak_of(lambda: scored.append(profile_step(model, state, max_num_batched_tokens, max_model_len)))
    vocab_size, logits_device = scored[0].shape[-1], scored[0].device
    scored.clear()
    if max_num_seqs:
        peak = max(peak, peak_of(lambda: profile_sampler(max_num_seqs, vocab_size, logits_device)))
    graphs = 0
    if graph_batch_size:
        graphs = peak_of(lambda: profile_decode_step(model, state, graph_batch_size, max_model_len))
    del state
    torch.cuda.empty_cache()  # hand the profiling step's blocks back, so the cache can take them
    free, total = torch.cuda.mem_get_info(device)
    non_torch = max(0, total - free - torch.cuda.memory_reserved(device))
    return GpuMemory(total=total, weights=weights, peak_activations=peak, non_torch=non_torch, graphs=graphs)
