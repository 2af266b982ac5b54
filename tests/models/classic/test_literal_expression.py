"""fairseq's expression arguments, evaluated without eval: lists, tuples, ints, +, * and nothing else."""

from __future__ import annotations

import pytest

from quill.models.classic.literal_expression import ExpressionError, literal_expression

WIKITEXT103 = ("[(850, 6)] * 3 + [(850, 1)] * 1 + [(850, 5)] * 4 + [(850, 1)] * 1 + [(850, 4)] * 3"
               " + [(1024, 4)] * 1 + [(2048, 4)] * 1")
GBW = ("[(512, 5)] + [(128, 1, 0), (128, 5, 0), (512, 1, 3)] * 3 + [(512, 1, 0), (512, 5, 0), (1024, 1, 3)] * 3"
       " + [(1024, 1, 0), (1024, 5, 0), (2048, 1, 3)] * 6 + [(1024, 1, 0), (1024, 5, 0), (4096, 1, 3)]")


def test_fairseqs_published_architectures():
    layers = literal_expression(WIKITEXT103)
    assert layers == [(850, 6)] * 3 + [(850, 1)] + [(850, 5)] * 4 + [(850, 1)] + [(850, 4)] * 3 + [(1024, 4), (2048, 4)]
    assert len(literal_expression(GBW)) == 1 + 3 * 13
    assert literal_expression("10000,20000,200000") == (10000, 20000, 200000)
    assert literal_expression("False") is False and literal_expression("[True] * 2") == [True, True]


@pytest.mark.parametrize("text", [
    "__import__('os').system('x')", "open('/etc/passwd')", "[(1, 2)] * 10**9", "[(1, 2)] * 10_000_000",
    "().__class__.__bases__", "[x for x in range(3)]", "lambda: 0", "'abc' * 3", "[1] + (2,)", "1.5", "-1",
    "[(1, 2)] * True", "",
])
def test_anything_else_is_refused(text):
    with pytest.raises(ExpressionError):
        literal_expression(text)
