"""The default recipes: which architecture, at what size, trained how.

Sized so each checkpoint is a few MB in float16 and trains in under 8 minutes on a 2-core CPU
(bfloat16 autocast, ~7-8k tokens/s on an idle machine); `max_minutes` caps the time on a slower or busier machine.
All three share one context length so their held-out perplexities are measured the same way.
"""

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from quill.models.training.trainer import TrainingConfig

CONTEXT = 256


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    architecture: str  # a key of models.registry.ARCHITECTURES
    model: Mapping[str, object]  # config kwargs; vocab_size comes from the tokenizer
    training: TrainingConfig = field(default_factory=TrainingConfig)


DEFAULT_RECIPES = (
    Recipe(
        name="shakespeare-transformer",
        architecture="transformer",
        model=MappingProxyType(dict(d_model=256, n_layers=4, n_heads=4, max_seq_len=CONTEXT, tie_embeddings=True)),
        training=TrainingConfig(context=CONTEXT, max_steps=1250, max_minutes=15, learning_rate=2e-3, eval_every=300),
    ),
    Recipe(
        name="shakespeare-lstm",
        architecture="lstm",
        # Hidden 384 rather than 512: ~1.4x the steps in the same minutes, which matters more than width
        # this far below one epoch. An LSTM sits at the unigram plateau for its first ~100 steps; a
        # higher learning rate leaves it sooner.
        model=MappingProxyType(dict(d_embed=256, d_hidden=384, n_layers=2, d_proj=256, tie_embeddings=True)),
        training=TrainingConfig(context=CONTEXT, max_steps=800, max_minutes=7.5, learning_rate=5e-3, eval_every=300),
    ),
    Recipe(
        name="shakespeare-gcnn",
        architecture="gcnn",
        model=MappingProxyType(dict(d_embed=256, d_model=256, n_blocks=4, layers_per_block=2, kernel_size=4)),
        training=TrainingConfig(context=CONTEXT, max_steps=800, max_minutes=7.5, learning_rate=2e-3, eval_every=300),
    ),
)


def recipe_names() -> list[str]:
    return [recipe.name for recipe in DEFAULT_RECIPES]


def get_recipe(name: str) -> Recipe:
    for recipe in DEFAULT_RECIPES:
        if recipe.name == name:
            return recipe
    raise KeyError(f"unknown recipe {name!r} (known: {', '.join(recipe_names())})")
