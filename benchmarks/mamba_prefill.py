"""What prefilling a long prompt costs a Mamba-1 model: Quill's step (the selective scan as a loop over the tokens,
as a CPU runs it, and in chunks, as a GPU does: quill/models/families/mamba_scan.py) against transformers' full forward (its
PyTorch fallback, mamba_ssm absent), on the same random weights of mamba-130m's shape.

    .venv/bin/python -m benchmarks.mamba_prefill                        # mamba-130m shape, 2,000 tokens
    .venv/bin/python -m benchmarks.mamba_prefill --threads 1 --chunks 16 64 --out runs/mamba_prefill.json
    .venv/bin/python -m benchmarks.mamba_prefill --smoke                # seconds, a tiny shape

Each figure is the fastest of --repeats runs, interleaved (a busy machine slows them alike), after a warm-up;
one sequence; only the last token's logits, as a prefill needs. Beside wall time, the process's CPU time, which
other work on a shared machine moves less. Random weights: no download.
"""

from __future__ import annotations

import torch

from quill.models.loading.hf import config_from_hf
from quill.models.families.mamba import MambaLanguageModel

from .common import prefill

# state-spaces/mamba-130m-hf's shape (tied embeddings).
SHAPE_130M = dict(vocab_size=50280, hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, conv_kernel=4,
                  time_step_rank=48)
SHAPE_TINY = dict(SHAPE_130M, vocab_size=300, hidden_size=32, num_hidden_layers=2, state_size=8, time_step_rank=4)


def build(shape: dict, device: torch.device):
    """transformers' MambaForCausalLM with random weights, and ours holding the same tensors."""
    import transformers

    torch.manual_seed(0)
    reference = transformers.MambaForCausalLM(transformers.MambaConfig(**shape)).eval().to(device)
    ours = MambaLanguageModel(config_from_hf(reference.config.to_dict())[0])
    return reference, prefill.load_tied(ours, reference).eval().to(device)


def main(argv: list[str] | None = None) -> dict:
    args = prefill.parse_options(argv, __doc__.split("\n\n")[0], chunks=[23], repeats=2, chunks_help=(
        "scan chunk lengths to time beside the token loop (23: what a GPU runs for 2,000 tokens)"))
    shape = SHAPE_TINY if args.smoke else SHAPE_130M
    reference, ours = build(shape, torch.device(args.device))
    # a chunk as long as the prompt: the scan's token loop
    chunks = {"quill, token loop": args.tokens} | {f"quill, chunks of {chunk}": chunk for chunk in args.chunks}
    return prefill.compare(args, shape, reference, ours, chunks)


if __name__ == "__main__":
    main()
