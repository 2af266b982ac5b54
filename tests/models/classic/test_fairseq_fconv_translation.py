"""fairseq's convolutional translation models (Gehring et al. 2017) as fairseq saves them, converted and run through
a busy engine: greedy and beam answers equal those of the reference written from the paper's equations
(tests/models/test_fconv_seq2seq.py), which recomputes every prefix; the decoder's convolution windows sit in slots
that beams copy, the encoder's (z, z + e) in blocks they share."""

from __future__ import annotations

import pytest
import torch

from quill.models.classic.conversion import convert
from quill.models.loading.checkpoint import load_checkpoint
from tests.models.classic.fairseq_translation_files import write_fairseq_checkpoint
from tests.models.test_fconv_seq2seq import ARGS, EOS, SOURCE_VOCAB, TARGET_VOCAB, Reference
from tests.toolkit_reference import check_against_reference

pytestmark = pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("fconv")
    reference = Reference(ARGS, seed=3)
    args = {k: v for k, v in ARGS.items() if k != "arch"}
    write_fairseq_checkpoint(root / "wmt", reference.state_dict(), "fconv_wmt_en_fr", SOURCE_VOCAB, TARGET_VOCAB,
                             langs=("en", "fr"), **args)
    result = convert(root / "wmt")
    assert result.architecture == "fconv_seq2seq"
    return reference, load_checkpoint(result.save(root / "quill"), device="cpu", dtype="float32")


def test_engine_answers_equal_the_reference(converted):
    reference, loaded = converted
    generator = torch.Generator().manual_seed(5)
    sources = [torch.randint(4, SOURCE_VOCAB, (n,), generator=generator).tolist() + [EOS] for n in (3, 9, 1, 13, 6)]

    def next_logprobs_of(source):
        return lambda prefix: reference([source], [prefix])[0, -1].log_softmax(-1)

    # a small block size: the longer sources span several encoder blocks
    check_against_reference(loaded, sources, next_logprobs_of, max_tokens=10, width=3, n=2,
                            block_size=4)
