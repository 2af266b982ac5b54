"""Tiny random-weight checkpoints of the state-space, xLSTM and short-convolution families, written by transformers'
own classes (`save_pretrained`), one module a family, and the checks the model, engine and server tests of these families share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quill.models.batch import StepBatch
from quill.models.loading.checkpoint import CheckpointError, load_checkpoint
from quill.server.engine.core import EngineCore
from quill.server.sampling import SamplingParams
from tests.server.engine.helpers import run_to_completion

VOCAB = 300  # every tiny checkpoint's vocabulary


def tokens(n: int, seed: int) -> list[int]:
    """`n` random token ids of the tiny vocabulary, the same for the same seed."""
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def full_logits(model, ids: list[int]) -> torch.Tensor:
    """(len(ids), V) Quill's model's logits of one whole sequence, from an empty state."""
    with torch.no_grad():
        return model(torch.tensor([ids]))[0]


def step_through(model, state, slot: int, ids: list[int], sizes: list[int], start: int = 0) -> torch.Tensor:
    """Feed `ids` to `slot` from position `start`, a step for each chunk of `sizes` tokens (the last size repeated
    until the ids run out); the logits of every token."""
    out, pos = [], 0
    while pos < len(ids):
        size = sizes[min(len(out), len(sizes) - 1)]
        batch = StepBatch.build([ids[pos : pos + size]], [start + pos], slots=[slot], logits="all")
        out.append(model.step(batch, state))
        pos += size
    return torch.cat(out)


def step_side_by_side(model, state, plans: dict[int, tuple[list[int], list[int]]]) -> dict[int, torch.Tensor]:
    """Run sequences side by side, one StepBatch a step: `plans` maps a slot to its tokens and how many of them it
    brings to each step (0: absent from that step; the last count repeated until its tokens run out). Returns each
    slot's logits of every token."""
    done = {slot: 0 for slot in plans}
    got: dict[int, list[torch.Tensor]] = {slot: [] for slot in plans}
    step = 0
    while any(done[slot] < len(text) for slot, (text, _) in plans.items()):
        seqs = [(slot, text[done[slot] : done[slot] + sizes[min(step, len(sizes) - 1)]])
                for slot, (text, sizes) in plans.items()]
        seqs = [(slot, new) for slot, new in seqs if new]
        assert seqs, f"step {step}: no sequence brings a token"
        batch = StepBatch.build([new for _, new in seqs], [done[slot] for slot, _ in seqs],
                                slots=[slot for slot, _ in seqs], logits="all")
        for (slot, new), rows in zip(seqs, model.step(batch, state).split(batch.query_lens)):
            got[slot].append(rows)
            done[slot] += len(new)
        step += 1
    return {slot: torch.cat(rows) for slot, rows in got.items()}


def greedy_by_forwards(reference, ids: list[int], steps: int) -> list[int]:
    """transformers' greedy tokens by full forwards without a cache (exact where its cached steps are not)."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(reference(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-steps:]


def assert_engine_greedy_matches(engine: EngineCore, reference, prompts: list[list[int]], params: SamplingParams,
                                 **generate) -> None:
    """Each prompt, run in `engine` as a greedy request of `params` beside whatever else it holds, gives
    transformers' greedy `generate(**generate)` tokens (`generate`: its settings, matching `params`)."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"greedy{i}", prompt, params)
    results = run_to_completion(engine)
    for i, prompt in enumerate(prompts):
        want = reference.generate(torch.tensor([prompt]), do_sample=False, **generate)
        assert results[f"greedy{i}"][0]["token_ids"] == want[0, len(prompt):].tolist(), f"prompt {i}"


def assert_beams_match(beams: dict[int, dict], reference, prompt: list[int], eos: int | None = None,
                       **generate) -> None:
    """The engine's beams of one request (`beams`: run_to_completion's outputs of it) equal transformers'
    `generate(num_beams=..., **generate)` with as many returned: their tokens and their scores.
    transformers pads a beam that ended early (on `eos`) with the pad token, here EOS: the padding is cut."""
    expected = reference.generate(torch.tensor([prompt]), do_sample=False, num_return_sequences=len(beams),
                                  output_scores=True, return_dict_in_generate=True, **generate)
    for j, beam in beams.items():
        want = expected.sequences[j, len(prompt):].tolist()
        while eos is not None and len(want) > len(beam["token_ids"]) and want[-1] == eos:
            want.pop()
        assert beam["token_ids"] == want, f"beam {j}"
        assert beam["score"] == pytest.approx(expected.sequences_scores[j].item(), abs=1e-4), f"beam {j}"


def assert_engine_beams_match(engine: EngineCore, reference, prompts: list[list[int]], params: SamplingParams,
                              eos: int | None = None, **generate) -> None:
    """Each prompt, run in `engine` as a beam-search request of `params`, returns `params.n` beams equal to
    transformers' (see assert_beams_match; `generate`: its settings, matching `params`)."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"beam{i}", prompt, params)
    results = run_to_completion(engine)
    for i, prompt in enumerate(prompts):
        assert len(results[f"beam{i}"]) == params.n
        assert_beams_match(results[f"beam{i}"], reference, prompt, eos=eos, **generate)


def edit_config(directory: Path, **changes) -> None:
    """Set keys of a saved checkpoint's config.json; its weights stay as saved."""
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def assert_load_refused(directory: Path, option: str, **changes) -> None:
    """The checkpoint in `directory`, with `changes` to its config, fails to load with an error naming `option`."""
    edit_config(directory, **changes)
    with pytest.raises(CheckpointError, match=option):
        load_checkpoint(directory, device="cpu", dtype="float32")
