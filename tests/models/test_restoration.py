"""The restoration task and the byte-level language model's data (quill/models/training/restoration*.py,
sentencepiece_vocab.py, byte_lm.py): the pairs, their SentencePiece model, a toy recipe of each encoder-decoder
family trained, saved as load_checkpoint reads it and restored through the engine. No network, seconds each."""

import math

import numpy as np
import pytest

from quill.models.loading.checkpoint import load_checkpoint
from quill.models.training.byte_lm import bits_per_character, byte_tokenizer
from quill.models.training.evaluate_restoration import restore, score
from quill.models.training.recipes import Recipe
from quill.models.training.restoration import Pair, evaluation_sample, play_lines, restoration_pairs, strip_line
from quill.models.training.restoration_pipeline import RestorationData, encode_pairs, train_restoration_recipe
from quill.models.training.sentencepiece_vocab import load_or_train_sentencepiece
from quill.models.training.trainer import TrainingConfig

PLAY = """THE TRAGEDY OF HAMLET

Dramatis Personae.

Hamlet, Prince of Denmark.


ACT I.

Scene I. Elsinore. A platform before the Castle.

[Francisco at his post. Enter to him
Bernardo.]

Ber.
Who's there?

Fran.
Nay, answer me: stand, and unfold yourself.

Ber.
He.
Long live the king! [Aside.] 'Tis now struck twelve; get thee to-morrow to bed, Francisco.

1 Citizen.
Most like:--it harrows me with fear and wonder.
"""

LINES = ["Who's there?", "Nay, answer me: stand, and unfold yourself.", "He.",
         "Long live the king! 'Tis now struck twelve; get thee to-morrow to bed, Francisco.",
         "Most like:--it harrows me with fear and wonder."]


def test_lines_leave_out_the_cast_headings_directions_and_titles():
    assert play_lines(PLAY) == LINES


def test_a_source_is_the_line_lowercased_without_punctuation():
    assert strip_line(LINES[3]) == "long live the king tis now struck twelve get thee tomorrow to bed francisco"
    assert strip_line(LINES[4]) == "most like it harrows me with fear and wonder"
    assert strip_line("  _Exit_  --  ") == "exit"
    assert restoration_pairs([PLAY])[0] == Pair("whos there", "Who's there?")
    assert restoration_pairs(["ACT I.\n\nBer.\n--!\n"]) == []  # nothing left of the source


def test_the_evaluation_sample_is_fixed_and_in_order():
    pairs = [Pair(str(i), str(i)) for i in range(100)]
    sample = evaluation_sample(pairs, 10)
    assert sample == evaluation_sample(pairs, 10) and len(sample) == 10
    assert [int(p.source) for p in sample] == sorted(int(p.source) for p in sample)
    assert evaluation_sample(pairs, 500) == pairs


def test_scores_against_the_references():
    references = LINES[3:]
    assert score(references, references) == {**score(references, references), "bleu": 100.0, "exact_match": 1.0}
    copied = score([strip_line(line) for line in references], references)
    assert copied["exact_match"] == 0.0 and 0 < copied["bleu"] < 100
    assert score([strip_line(references[0]), references[1]], references)["exact_match"] == 0.5


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory) -> RestorationData:
    lines = [line for _ in range(20) for line in LINES] + ["And let us once again assail your ears,",
                                                          "That are so fortified against our story,"] * 20
    pairs = restoration_pairs(["\n".join(lines)])
    path = tmp_path_factory.mktemp("spm") / "toy.model"
    model = load_or_train_sentencepiece(path, [p.source for p in pairs] + [p.target for p in pairs], 80)
    return RestorationData(model, path, pairs, pairs[:7], encode_pairs(model, pairs), encode_pairs(model, pairs[:7]))


TOYS = {
    "seq2seq": dict(d_model=16, encoder_layers=1, decoder_layers=1, n_heads=2, encoder_ffn=24, decoder_ffn=24,
                    max_source_len=128, max_seq_len=128, pre_norm=True, final_norm=True),
    "fconv_seq2seq": dict(encoder_embed_dim=16, decoder_embed_dim=16, out_embed_dim=16, share_input_output_embed=True,
                          encoder_layers=[[16, 3, 1]], decoder_layers=[[16, 3, 1]], max_source_len=128,
                          max_seq_len=128),
    "rnn_seq2seq": dict(hidden_size=16, layers=1, source_embed_dim=8, target_embed_dim=16, bidirectional=True,
                        share_decoder_embeddings=True, max_source_len=128, max_seq_len=128),
}


@pytest.mark.parametrize("architecture", sorted(TOYS))
def test_a_toy_restoration_recipe_is_saved_served_and_scored(tmp_path, toy_data, architecture):
    recipe = Recipe(name=f"toy-{architecture}", architecture=architecture, model=TOYS[architecture], task="restoration")
    config = TrainingConfig(context=64, batch_size=8, max_steps=4, warmup_steps=1, eval_batch_size=4,
                            autocast_bfloat16=False, num_threads=1)
    pairs = toy_data.validation[:3]
    figures = train_restoration_recipe(recipe, toy_data, tmp_path, config, "cpu", evaluation_beam=2)

    assert figures["steps"] == 4 and figures["saved_dtype"] == "float16"
    assert math.isfinite(figures["validation_perplexity"])
    assert figures["scores"]["lines"] == len(toy_data.evaluation_pairs())
    assert set(figures["scores"]) >= {"greedy", "beam2"}
    loaded = load_checkpoint(tmp_path / recipe.name, device="cpu", dtype="float32")  # the toolkit tokenizer, as is
    assert loaded.architecture == architecture and loaded.eos_token_ids == [2]
    source = loaded.seq2seq.source_ids(pairs[0].source)
    assert source == toy_data.sentencepiece.encode(pairs[0].source) + [2]  # </s> appended, as trained
    answers = restore(loaded, [p.source for p in pairs])
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)
    covered = restore(loaded, [p.source for p in pairs], 2, coverage_penalty=0.3, coverage_penalty_type="summary")
    assert len(covered) == 3 and all(isinstance(a, str) for a in covered)


def test_the_byte_tokenizer_is_one_token_a_byte_after_the_end_of_text():
    tokenizer = byte_tokenizer()
    assert tokenizer.get_vocab_size() == 257 and tokenizer.token_to_id("<|endoftext|>") == 0
    for text in ["To be, or not to be", "naïve café 東京 🎭\x00\n\t  ", ""]:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert ids == [b + 1 for b in text.encode()]
        assert tokenizer.decode(ids) == text


def test_bits_per_character_count_the_stream_over_the_characters():
    stream = np.zeros(1 + 1000 + 1 + 500 + 1)  # EOS play EOS play EOS: 1502 tokens predicted
    assert bits_per_character(2.0, stream, 1500) == pytest.approx(1502 / 1500)
