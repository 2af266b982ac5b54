"""The toolkit translation models' text rules against the tools they were trained with: subword-nmt's own apply_bpe
for the BPE, sacremoses (which fairseq's `moses` tokenizer calls) for the Moses steps."""

from __future__ import annotations

import io
import json

import pytest
from sacremoses import MosesDetokenizer, MosesTokenizer
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe

from quill.models.loading.errors import CheckpointError
from quill.models.text.toolkit_tokenizer import (TOOLKIT_TOKENIZER_FILE, SubwordBPE, load_toolkit_tokenizer,
                                                 read_bpe_codes, write_toolkit_tokenizer)

TEXT = """It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.
"Whose woods these are I think I know." His house is in the village, though; he will not see me stopping here.
The well-known author's 3.5-year-old manuscript cost $1,200 -- or so they said (in 1859).
There were a king with a large jaw and a queen with a plain face, on the throne of England!
A thing of beauty is a joy for ever: its loveliness increases; it will never pass into nothingness.
Call me Ishmael. Some years ago - never mind how long precisely - having little or no money in my purse...
"""


@pytest.fixture(scope="module")
def codes(tmp_path_factory):
    path = tmp_path_factory.mktemp("bpe") / "bpecodes"
    moses = MosesTokenizer(lang="en")
    tokenized = "\n".join(moses.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)
                          for line in TEXT.splitlines())
    out = io.StringIO()
    learn_bpe(io.StringIO(tokenized), out, 150, min_frequency=1)
    path.write_text(out.getvalue(), encoding="utf-8")
    return path


def test_bpe_splits_words_as_subword_nmt(codes):
    reference = BPE(io.StringIO(codes.read_text(encoding="utf-8")))
    ours = SubwordBPE(read_bpe_codes(codes))
    words = TEXT.split() + ["unseenwords", "x", "zzzz", "wisdomfoolishness", "the"]
    for line in [TEXT.replace("\n", " "), " ".join(words)]:
        assert " ".join(ours.apply(line.split())) == reference.process_line(line).strip()


def test_codes_with_counts_and_bad_lines(tmp_path):
    path = tmp_path / "codes"
    path.write_text("t h 10\nth e</w> 9\n", encoding="utf-8")  # fastBPE writes a count after each merge
    assert SubwordBPE(read_bpe_codes(path)).apply(["the", "then"]) == ["the", "th@@", "e@@", "n"]
    path.write_text("#version: 0.2\nt h\nbroken\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="line 2"):
        read_bpe_codes(path)
    path.write_text("#version: 0.1\nt h\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="version 0.1"):
        read_bpe_codes(path)


def _vocab(codes, lines) -> list[str]:
    bpe = BPE(io.StringIO(codes.read_text(encoding="utf-8")))
    moses = MosesTokenizer(lang="en")
    words = {t for line in lines for t in bpe.process_line(
        moses.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)).split()}
    return ["<s>", "<pad>", "</s>", "<unk>", *sorted(words)]


def test_fairseq_rules_round_trip(codes, tmp_path):
    lines = TEXT.splitlines()
    vocab = _vocab(codes, lines)
    spec = {"toolkit": "fairseq", "source_vocab": vocab, "target_vocab": vocab,
            "specials": {"unk": "<unk>", "pad": "<pad>", "bos": "<s>", "eos": "</s>"}, "source_suffix": ["</s>"],
            "languages": ["en", "en"], "moses": True, "lowercase": False, "bpe_codes": str(codes),
            "sentencepiece": None}
    write_toolkit_tokenizer(tmp_path, spec)
    assert json.loads((tmp_path / TOOLKIT_TOKENIZER_FILE).read_text())["bpe_codes"] == "bpecodes"
    tokenizer = load_toolkit_tokenizer(tmp_path)
    moses, detok = MosesTokenizer(lang="en"), MosesDetokenizer(lang="en")
    bpe = BPE(io.StringIO(codes.read_text(encoding="utf-8")))
    for line in lines:
        pieces = bpe.process_line(moses.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True))
        ids = tokenizer.source_ids(line)
        assert ids == [vocab.index(p) for p in pieces.split()] + [2]
        # the target side decodes as fairseq does: BPE marks removed, then Moses detokenization
        expected = detok.detokenize((pieces + " ").replace("@@ ", "").rstrip().split())
        assert tokenizer.target.decode(ids) == expected
    assert tokenizer.source_ids("zebra")[-1] == 2 and 3 in tokenizer.source_ids("zebra")  # unknown pieces: <unk>
    with pytest.raises(ValueError, match="translates en into en only"):
        tokenizer.source_ids("x", source_lang="fr")


def test_unmarked_pair_and_missing_files(codes, tmp_path):
    vocab = ["<blank>", "<unk>", "<s>", "</s>", "a", "b"]
    spec = {"toolkit": "opennmt", "source_vocab": vocab, "target_vocab": vocab,
            "specials": {"unk": "<unk>", "pad": "<blank>", "bos": "<s>", "eos": "</s>"}, "source_suffix": [],
            "languages": None, "moses": False, "bpe_codes": None, "sentencepiece": None}
    write_toolkit_tokenizer(tmp_path, spec)
    tokenizer = load_toolkit_tokenizer(tmp_path)
    assert tokenizer.source_ids("a b c") == [4, 5, 1]
    assert tokenizer.target.decode([2, 4, 5, 3]) == "a b"
    with pytest.raises(ValueError, match="names no languages"):
        tokenizer.source_ids("a", target_lang="de")
    spec["bpe_codes"] = "nowhere"
    (tmp_path / TOOLKIT_TOKENIZER_FILE).write_text(json.dumps(spec))
    with pytest.raises(CheckpointError, match="nowhere"):
        load_toolkit_tokenizer(tmp_path)
    spec.update(bpe_codes=None, target_vocab=["a"])
    (tmp_path / TOOLKIT_TOKENIZER_FILE).write_text(json.dumps(spec))
    with pytest.raises(CheckpointError, match="target vocabulary lacks"):
        load_toolkit_tokenizer(tmp_path)


def test_streamed_text_adds_up_to_the_whole_answer(codes, tmp_path):
    """Moses' detokenization reads whole words and pairs quotes, so deltas come from decoding the whole output and
    holding back its last word: they add up to the whole decode, for the corpus' lines and for shuffled pieces."""
    import random

    from quill.models.text.tokenizer import IncrementalDecoder

    lines = TEXT.splitlines()
    vocab = _vocab(codes, lines)
    spec = {"toolkit": "fairseq", "source_vocab": vocab, "target_vocab": vocab,
            "specials": {"unk": "<unk>", "pad": "<pad>", "bos": "<s>", "eos": "</s>"}, "source_suffix": ["</s>"],
            "languages": ["en", "en"], "moses": True, "bpe_codes": str(codes), "sentencepiece": None}
    write_toolkit_tokenizer(tmp_path, spec)
    target = load_toolkit_tokenizer(tmp_path).target
    rng = random.Random(0)
    answers = [target.encode(line) + [2] for line in lines]
    answers += [rng.sample(range(4, len(vocab)), 12) + [2] for _ in range(40)]
    for ids in answers:
        decoder = IncrementalDecoder(target, [2])  # the decoder's prompt: its start token
        streamed = "".join(decoder.push(i) for i in ids) + decoder.flush()
        assert streamed == target.decode(ids), [vocab[i] for i in ids]
