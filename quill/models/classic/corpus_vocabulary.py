"""The vocabulary of PyTorch's word_language_model, which its checkpoints do not store.

The example's `data.Corpus` builds it while reading its data directory: train.txt, then valid.txt,
then test.txt, each line split on whitespace with `<eos>` appended, every word given the next id the
first time it is seen. Rebuilding it from the same directory gives the same ids. A vocabulary file
(one word per line, in id order) says the same thing without the corpus.
"""

from __future__ import annotations

from pathlib import Path

from quill.models.loading.errors import CheckpointError

SPLITS = ("train.txt", "valid.txt", "test.txt")  # the order data.Corpus reads them in
LINE_END = "<eos>"  # what data.Corpus appends to every line
VOCAB_FILE = "vocab.txt"


def corpus_words(directory: Path) -> list[str]:
    """The words of `directory`'s corpus, in the order data.Corpus numbers them."""
    if not (directory / SPLITS[0]).is_file():
        raise CheckpointError(directory / SPLITS[0], "missing file (a word_language_model data directory has "
                                                     f"{', '.join(SPLITS)})")
    ids: dict[str, int] = {}
    for split in SPLITS:
        if not (directory / split).is_file():
            continue  # a missing split only shows as a vocabulary smaller than the model's, which is checked
        with open(directory / split, encoding="utf8") as f:
            for line in f:
                for word in line.split() + [LINE_END]:
                    ids.setdefault(word, len(ids))
    return list(ids)


def file_words(path: Path) -> list[str]:
    """One word per line, line i being id i."""
    words = path.read_text(encoding="utf8").splitlines()
    for number, word in enumerate(words, 1):
        if not word or word != word.strip() or len(word.split()) != 1:
            raise CheckpointError(path, f"line {number} is not one word ({word!r}): a vocabulary file has one "
                                        "word per line, in id order")
    return words


def vocabulary_source(model_file: Path, given: Path | None) -> Path:
    """The vocabulary file or data directory to read: `given`, else one beside the model file (vocab.txt,
    a directory holding train.txt: the model's own, or the one subdirectory that is one)."""
    if given is not None:
        if not given.exists():
            raise CheckpointError(given, "no such vocabulary file or data directory")
        return given
    here = model_file.parent
    if (here / VOCAB_FILE).is_file():
        return here / VOCAB_FILE
    if (here / SPLITS[0]).is_file():
        return here
    data_dirs = [d for d in sorted(here.iterdir()) if d.is_dir() and (d / SPLITS[0]).is_file()]
    if len(data_dirs) == 1:
        return data_dirs[0]
    found = f" (found several: {', '.join(d.name for d in data_dirs)})" if data_dirs else ""
    raise CheckpointError(model_file, "word_language_model checkpoints do not store their vocabulary: give the "
                                      f"data directory it was trained on (train.txt, valid.txt, test.txt) or a "
                                      f"{VOCAB_FILE} (one word per line, in id order), beside the model or with "
                                      f"--vocab{found}")


def read_vocabulary(source: Path) -> list[str]:
    return corpus_words(source) if source.is_dir() else file_words(source)
