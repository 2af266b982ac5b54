"""dict.txt numbered as fairseq's Dictionary numbers it; malformed files refused with the line."""

from __future__ import annotations

import pytest

from quill.models.classic.fairseq_dictionary import pad_dictionary, read_dictionary
from quill.models.loading.errors import CheckpointError


def write(tmp_path, text):
    path = tmp_path / "dict.txt"
    path.write_text(text)
    return path


def test_specials_first_then_the_files_words_in_order(tmp_path):
    path = write(tmp_path, "the 100\n, 90\n<unk> 5 #fairseq:overwrite\nmadeupword0000 0\n")
    words = read_dictionary(path)
    assert words == ["<s>", "<pad>", "</s>", "<unk>", "the", ",", "<unk>", "madeupword0000"]
    assert pad_dictionary(words, 10, path)[-2:] == ["madeupword0000", "madeupword0001"]


@pytest.mark.parametrize("text, words", [("the 1\nthe 2\n", "listed twice"), ("the\n", "line 1"),
                                         ("a 1\nb x\n", "line 2")])
def test_malformed_lines_are_refused(tmp_path, text, words):
    with pytest.raises(CheckpointError, match=words):
        read_dictionary(write(tmp_path, text))


def test_more_words_than_the_model_embeds_is_refused(tmp_path):
    path = write(tmp_path, "a 1\nb 1\n")
    with pytest.raises(CheckpointError, match="embeds only 5"):
        pad_dictionary(read_dictionary(path), 5, path)
