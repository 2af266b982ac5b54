"""From corpus to shipped restoration model: the pairs and their SentencePiece model, shared by the three
encoder-decoder recipes; one recipe trained, saved in float16 with its toolkit_tokenizer.json, and scored through
Quill's engine (evaluate_restoration.py)."""

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import sentencepiece
import torch

from quill.models.families.registry import ARCHITECTURES
from quill.models.loading.checkpoint import load_checkpoint
from quill.models.loading.saving import save_checkpoint
from quill.models.text.toolkit_tokenizer import write_toolkit_tokenizer
from quill.models.training.corpus import load_shakespeare
from quill.models.training.evaluate_restoration import evaluate_checkpoint
from quill.models.training.pipeline import rounded_to, shrink_embeddings, training_figures
from quill.models.training.recipes import Recipe
from quill.models.training.restoration import Pair, evaluation_sample, restoration_pairs
from quill.models.training.sentencepiece_vocab import SPECIAL_IDS, load_or_train_sentencepiece, toolkit_spec
from quill.models.training.seq2seq_forward import TRAINING_FORWARDS
from quill.models.training.seq2seq_trainer import EncodedPair, SpecialIds, collate, mean_nll, train_pairs
from quill.models.training.trainer import TrainingConfig

VOCAB_SIZE = 3000
VALIDATION_PAIRS = 2000  # held-out pairs whose perplexity is tracked while training (a sample, for time)
EVALUATION_LINES = 500  # held-out lines restored through the engine and scored
IDS = SpecialIds(pad=SPECIAL_IDS["pad"], start=SPECIAL_IDS["bos"], eos=SPECIAL_IDS["eos"])


@dataclass(frozen=True, slots=True)
class RestorationData:
    sentencepiece: sentencepiece.SentencePieceProcessor
    sentencepiece_path: Path
    train: list[Pair]
    validation: list[Pair]  # every held-out pair
    train_ids: list[EncodedPair]
    validation_ids: list[EncodedPair]  # the VALIDATION_PAIRS sample, encoded

    @property
    def vocab_size(self) -> int:
        return self.sentencepiece.get_piece_size()

    def evaluation_pairs(self, lines: int = EVALUATION_LINES) -> list[Pair]:
        return evaluation_sample(self.validation, lines, seed=0)

    def describe(self) -> dict:
        return {
            "task": "restore case and punctuation: source = a line lowercased, punctuation removed "
                    "(quill/models/training/restoration.py); target = the line as printed",
            "train_pairs": len(self.train),
            "validation_pairs": len(self.validation),
            "tracked_validation_pairs": len(self.validation_ids),
            "sentencepiece_pieces": self.vocab_size,
            "sentencepiece_sha256": hashlib.sha256(self.sentencepiece_path.read_bytes()).hexdigest(),
        }


def encode_pairs(model: sentencepiece.SentencePieceProcessor, pairs: list[Pair]) -> list[EncodedPair]:
    """Sources with </s> appended, as toolkit_tokenizer.json's source_suffix has the server do."""
    sources = model.encode([p.source for p in pairs])
    targets = model.encode([p.target for p in pairs])
    return [(s + [IDS.eos], t) for s, t in zip(sources, targets)]


def prepare_restoration(data_dir: Path, vocab_size: int = VOCAB_SIZE) -> RestorationData:
    """The pairs of the training and held-out plays; the SentencePiece model trained on the training pairs' sources
    and targets once, cached in data_dir."""
    split = load_shakespeare(data_dir)
    train, validation = restoration_pairs(split.train.values()), restoration_pairs(split.validation.values())
    path = Path(data_dir) / f"restoration-unigram{vocab_size}.model"
    model = load_or_train_sentencepiece(path, [p.source for p in train] + [p.target for p in train], vocab_size)
    tracked = evaluation_sample(validation, VALIDATION_PAIRS, seed=1)
    return RestorationData(model, path, train, validation, encode_pairs(model, train), encode_pairs(model, tracked))


def build_seq2seq(recipe: Recipe, vocab_size: int, seed: int) -> torch.nn.Module:
    config_class, model_class = ARCHITECTURES[recipe.architecture]
    sizes = {"source_vocab_size": vocab_size} if recipe.architecture == "rnn_seq2seq" else {}
    torch.manual_seed(seed)
    model = model_class(config_class(vocab_size=vocab_size, decoder_start_token_id=IDS.start, pad_token_id=IDS.pad,
                                     **sizes, **recipe.model))
    if recipe.embedding_std is not None:
        shrink_embeddings(model, recipe.embedding_std)
    return model


def train_restoration_recipe(recipe: Recipe, data: RestorationData, out_dir: Path, config: TrainingConfig,
                             device: str, evaluation_beam: int | None) -> dict:
    """Train one recipe, save it as float16, and return its figures, measured on the weights as saved."""
    model = build_seq2seq(recipe, data.vocab_size, config.seed)
    forward = TRAINING_FORWARDS[recipe.architecture]
    record = train_pairs(model, forward, data.train_ids, data.validation_ids, IDS, config, device, recipe.name)

    saved_dtype = torch.float16
    as_saved = rounded_to(model.cpu(), saved_dtype).eval()
    saved_nll = mean_nll(as_saved, forward, data.validation_ids, IDS, config.eval_batch_size)
    figures = training_figures(recipe, record, saved_dtype)
    # per target token (and end token), teacher forced; the trainer counts target tokens
    figures |= {"validation_perplexity": math.exp(saved_nll), "target_tokens_seen": figures.pop("tokens_seen")}
    directory = Path(out_dir) / recipe.name
    save_checkpoint(directory, recipe.architecture, model.cpu(), None, dtype=saved_dtype,
                    metadata={**figures, "task": data.describe()}, eos_token_id=IDS.eos)
    write_toolkit_tokenizer(directory, toolkit_spec(data.sentencepiece, data.sentencepiece_path))
    check_saved_matches(directory, as_saved, forward, data.validation_ids[:8])
    figures["checkpoint"] = str(directory)
    figures["scores"] = evaluate_checkpoint(directory, data.evaluation_pairs(), evaluation_beam)
    return figures


def check_saved_matches(directory: Path, as_saved: torch.nn.Module, forward, pairs: list[EncodedPair]) -> None:
    """Guard the reported figures: the checkpoint must load back to exactly the weights evaluated."""
    loaded = load_checkpoint(directory, device="cpu", dtype="float32").model
    sources, lengths, inputs, _ = collate(pairs, IDS)
    with torch.no_grad():
        difference = (forward(loaded, sources, lengths, inputs) - forward(as_saved, sources, lengths, inputs))
    worst = difference.abs().max().item()
    if not math.isfinite(worst) or worst > 1e-3:
        raise RuntimeError(f"{directory} reloads to different outputs (max |diff| {worst})")
