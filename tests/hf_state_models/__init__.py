"""Tiny random-weight checkpoints of the state-space, xLSTM and short-convolution families, written by transformers'
own classes (`save_pretrained`), one module a family: for the model, engine and server tests and the benchmarks."""

from __future__ import annotations

import pytest
import torch


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
