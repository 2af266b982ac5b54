"""What prefilling a long prompt costs a Mamba-2 model: Quill's step (chunked SSD scan) against transformers'
full forward (its PyTorch fallback, mamba_ssm absent), on the same random weights of a real model's shape.

    .venv/bin/python -m benchmarks.mamba2_prefill                         # mamba2-130m shape, 2,000 tokens
    .venv/bin/python -m benchmarks.mamba2_prefill --threads 1 --chunks 64 128 256 --out runs/mamba2_prefill.json
    .venv/bin/python -m benchmarks.mamba2_prefill --smoke                 # seconds, a tiny shape

Each figure is the fastest of --repeats runs, interleaved (a busy machine slows them alike), after a warm-up;
one sequence; only the last token's logits. Beside wall time, the process's CPU time, which other work on a
shared machine moves less. Random weights: no download.
"""

from __future__ import annotations

import json

import torch

from quill.models.loading.hf import config_from_hf
from quill.models.families.mamba2 import Mamba2LanguageModel

from .common import prefill

# state-spaces/mamba2-130m's shape (vocabulary 50,277 padded to a multiple of 16, tied embeddings).
SHAPE_130M = dict(vocab_size=50288, hidden_size=768, num_hidden_layers=24, expand=2, num_heads=24, head_dim=64,
                  state_size=128, n_groups=1, conv_kernel=4, chunk_size=256, tie_word_embeddings=True)
SHAPE_TINY = dict(SHAPE_130M, vocab_size=300, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16,
                  state_size=8, chunk_size=16)


def build(shape: dict, device: torch.device):
    """transformers' Mamba2ForCausalLM with random weights, and ours holding the same tensors."""
    import transformers

    torch.manual_seed(0)
    reference = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(**shape)).eval().to(device)
    ours = Mamba2LanguageModel(config_from_hf(json.loads(reference.config.to_json_string()))[0])
    return reference, prefill.load_tied(ours, reference).eval().to(device)


def main(argv: list[str] | None = None) -> dict:
    args = prefill.parse_options(argv, __doc__.split("\n\n")[0], chunks=[64, 256], repeats=3,
                                 chunks_help="our scan's chunk sizes to time")
    shape = SHAPE_TINY if args.smoke else SHAPE_130M
    reference, ours = build(shape, torch.device(args.device))
    chunks = {f"quill, chunks of {chunk}": chunk for chunk in args.chunks}
    return prefill.compare(args, shape, reference, ours, chunks)


if __name__ == "__main__":
    main()
