"""OpenNMT-py's LSTM encoder-decoders with attention and input feeding, as onmt_train saves them, converted and run
through a busy engine: greedy and beam answers equal those of the reference written from the equations
(tests/models/test_rnn_seq2seq.py); the decoder's (h, c) and input feed sit in slots that beams copy, started from
the encoder's final state that every beam reads. The text rules its options name: SentencePiece models found beside
the checkpoint, text split on spaces without one, the OpenNMT Tokenizer refused."""

from __future__ import annotations

import io

import pytest
import sentencepiece
import torch

from quill.models.classic.conversion import convert
from quill.models.loading.checkpoint import load_checkpoint
from quill.models.loading.errors import CheckpointError
from quill.server.sampling import SamplingParams
from tests.models.classic.fairseq_translation_files import TEXT
from tests.models.test_rnn_seq2seq import SOURCE_TOKENS, SPECIAL, reference, save, tiny_model, vocab_in_form
from tests.toolkit_reference import check_against_reference, engine_outputs


@pytest.mark.parametrize("options", [
    dict(rnn_type="LSTM", bidirectional=True, global_attention="general", input_feed=True, layers=2),
    dict(rnn_type="GRU", bidirectional=False, global_attention="mlp", input_feed=False, layers=1),
])
def test_engine_answers_equal_the_reference(tmp_path, options):
    model = tiny_model(7, **options)
    (tmp_path / "onmt").mkdir()
    save(tmp_path / "onmt" / "model_step_1000.pt", model, "v3")
    loaded = load_checkpoint(convert(tmp_path / "onmt").save(tmp_path / "quill"), device="cpu", dtype="float32")
    assert loaded.architecture == "rnn_seq2seq" and loaded.seq2seq.pair is None
    eos = loaded.eos_token_ids[0]
    assert SPECIAL[eos] == "</s>"
    generator = torch.Generator().manual_seed(11)
    sources = [torch.randint(4, len(SOURCE_TOKENS), (n,), generator=generator).tolist() for n in (2, 9, 5, 1, 12)]

    def next_logprobs_of(source):
        return lambda prefix: reference(model, source, prefix)[-1]

    check_against_reference(loaded, sources, next_logprobs_of, max_tokens=10, width=3, n=2, block_size=4)


def _sentencepiece(path, size: int) -> list[str]:
    """A SentencePiece model trained on TEXT at `path`; returns its pieces after OpenNMT's four specials."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(TEXT.splitlines() * 4), model_writer=model,
                                             vocab_size=size, character_coverage=1.0, minloglevel=2)
    path.write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def test_sentencepiece_found_beside_the_checkpoint(tmp_path):
    directory = tmp_path / "onmt"
    directory.mkdir()
    pieces = _sentencepiece(directory / "spm.model", 60)
    vocab = SPECIAL + [p for p in pieces if p not in ("<unk>", "<s>", "</s>")]
    model = tiny_model(8, vocab_size=len(vocab), source_vocab_size=len(vocab))
    options = dict(transforms=["sentencepiece"], src_subword_model="/data/run1/spm.model",
                   tgt_subword_model="C:\\data\\spm.model")  # the training machine's paths
    save(directory / "model.pt", model, "v3", vocab=vocab_in_form("v3", vocab, vocab), **options)
    loaded = load_checkpoint(convert(directory).save(tmp_path / "quill"), weights=False)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(directory / "spm.model"))
    text = TEXT.splitlines()[2]
    ids = loaded.seq2seq.source_ids(text)
    assert ids == [vocab.index(p) for p in processor.encode(text, out_type=str)]  # nothing appended
    assert loaded.tokenizer.decode(ids) == text

    (directory / "spm.model").unlink()
    with pytest.raises(CheckpointError, match=r"spm\.model.*missing.*sentencepiece"):
        convert(directory)
    save(directory / "model.pt", model, "v3", vocab=vocab_in_form("v3", vocab, vocab), transforms=["onmt_tokenize"])
    with pytest.raises(CheckpointError, match="onmt_tokenize"):
        convert(directory)


def test_beam_scores_with_wu_length_penalty(tmp_path):
    """OpenNMT's `-length_penalty wu -alpha 0.6`: each of the n best answers scored as its summed log-probability
    over ((5 + length) / 6) ** 0.6, best first."""
    model = tiny_model(9, rnn_type="LSTM", bidirectional=True, global_attention="dot", input_feed=True, layers=1)
    (tmp_path / "onmt").mkdir()
    save(tmp_path / "onmt" / "model.pt", model, "v3")
    loaded = load_checkpoint(convert(tmp_path / "onmt").save(tmp_path / "quill"), device="cpu", dtype="float32")
    source = [5, 9, 3, 7, 11, 4]
    params = SamplingParams(max_tokens=8, temperature=0, use_beam_search=True, beam_width=4, n=3,
                            length_penalty=0.6, length_penalty_type="wu")
    answers = engine_outputs(loaded, {"r": (source, params)})["r"]
    start = loaded.model.config.decoder_start_token_id
    expected = []
    for tokens, _ in answers:
        logprobs = reference(model, source, [start] + tokens[:-1])
        total = sum(float(logprobs[i, t]) for i, t in enumerate(tokens))
        expected.append(total / ((5 + len(tokens)) / 6) ** 0.6)
    assert [score for _, score in answers] == pytest.approx(expected, abs=1e-4)
    assert expected == sorted(expected, reverse=True)
