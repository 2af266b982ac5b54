"""The model runner, the only part of the engine that touches tensors: one scheduled batch in, its tokens out.

A step (1) applies the cache managers' device work (block copies, slot copies and resets), and the
batch's changes to sequences' block tables or slots to its own table of them on the device
(cache_table.py), (2) packs the scheduled tokens into persistent, max-sized input buffers (one
host-to-device copy per field; each sequence's blocks or slot are gathered on the device from its row
of that table), (3) runs the model (telling a model that declares `cheap_argmax` which rows need only
their argmax: plain greedy requests), or for a decode-only step replays the CUDA graph captured for its
batch size (`capture_graphs`; graphs score every row fully), (4) on the device: samples a token for every
sequence whose tokens are now all computed, ranks the candidates of every beam request with one top-k, and
scores prompt tokens for requests that asked (constrained rows are first masked by their grammars, the
masks filled on the host while the model ran: grammar_masks.py), and (5) brings everything the host needs back in
a single device-to-host copy.

`launch` stops before the host waits for that copy: it returns a `PendingStep` whose `result()` waits.
With overlapped scheduling the engine launches the next decode step in between, its input tokens
taken on the device from this step's sampled ids (`inputs_from`), so the GPU never waits for the host.
The rows of plain one-token decodes persist from step to step (decode_rows.py): a step keeps those of the
step before that decode again, their input tokens that step's samples on the device, drops those that
left and packs only what comes behind them; when it decodes exactly the same rows (the steady state) their
inputs stay on the device as they are, the positions moved one on.

model_runner.py   the step: what it keeps, what it packs, eager or replayed
decode_rows.py    the persistent batch: the plain decode rows kept from the step before, updated by deltas
inputs.py         the packed host lists, which logits rows serve what, the persistent device buffers
sampling_plan.py  who samples from which row, with which settings gathered on the device
graphs.py         the decode steps captured and replayed as CUDA graphs
read_out.py       samples, beam candidates and prompt scores queued for one copy back, and read
"""

from .model_runner import ModelRunner
from .read_out import PendingStep, Sampled, StepResult

__all__ = ["ModelRunner", "PendingStep", "Sampled", "StepResult"]
