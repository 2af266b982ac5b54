"""dtype_perplexity scores a checkpoint in float32 and in bfloat16 over the same held-out stream."""

from __future__ import annotations

import math

import torch

from benchmarks.dtype_perplexity import DTYPES, score
from quill.models.loading.checkpoint import save_checkpoint
from tests.conftest import build_tiny_model


def test_both_dtypes_score_the_same_stream(tiny_tokenizer, tmp_path):
    arch, model = build_tiny_model("transformer-gpt2", tiny_tokenizer.vocab_size)
    path = save_checkpoint(tmp_path, arch, model, tiny_tokenizer, dtype=torch.float32)
    documents = ["To be, or not to be, that is the question.", "Now is the winter of our discontent."]
    row = score(str(path), documents)
    encoded = sum(len(tiny_tokenizer.hf.encode(d, add_special_tokens=False).ids) for d in documents)
    assert row["tokens"] == 1 + len(documents) + encoded  # each document between end-of-text marks
    # a random model scores badly in either dtype; the two mean log-likelihoods differ by bfloat16's rounding only
    assert all(1 < row[dtype] and math.isfinite(row[dtype]) for dtype in DTYPES)
    assert abs(math.log(row["bfloat16"]) - math.log(row["float32"])) < 0.02 * math.log(row["float32"])
