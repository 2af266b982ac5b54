"""The default recipes: which task, which architecture, at what size, trained how.

Sized so each checkpoint is a few MB in float16 and trains in under 8 minutes on a 2-core CPU
(bfloat16 autocast, ~7-8k tokens/s on an idle machine); `max_minutes` caps the time on a slower or busier machine.
The three BPE language models share one context length so their held-out perplexities are measured the same way.

Tasks: "language-model" (the shared 4,096-token BPE, pipeline.py), "byte-language-model" (bytes, byte_lm.py) and
"restoration" (encoder-decoders restoring case and punctuation, restoration_pipeline.py). The later recipes were
sized on a 2-core EPYC without AVX-512, shared with other jobs: bfloat16 autocast is off for them (there it made
steps ~5x slower, with no bfloat16 instructions to run it on).
"""

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from quill.models.training.trainer import TrainingConfig

CONTEXT = 256
TASKS = ("language-model", "byte-language-model", "restoration")


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    architecture: str  # a key of models.registry.ARCHITECTURES
    model: Mapping[str, object]  # config kwargs; vocab_size comes from the tokenizer
    training: TrainingConfig = field(default_factory=TrainingConfig)
    task: str = "language-model"  # one of TASKS
    # Embeddings drawn from N(0, std) (pipeline.shrink_embeddings: tied to the output layer, N(0, 1) starts with
    # huge logits); None keeps PyTorch's N(0, 1), which the LSTMs trained from bytes and pieces here need: at
    # std 0.0625 their inputs were so small that after 120 steps the char-LSTM stood at 4.19 bits per character
    # held out against 2.69 (lr 4e-3), and after 400 the restoration LSTM at perplexity 262 against 42 (lr 1e-3).
    embedding_std: float | None = 0.0625

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, not {self.task!r}")


LANGUAGE_MODEL_RECIPES = (
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


# Restoration: the SentencePiece vocabulary (3,000 pieces) shared by source and target; sizes to ~3M parameters
# (~6 MB in float16). A step is 64 pairs (~800 target tokens).
RESTORATION_TRAINING = TrainingConfig(context=128, batch_size=64, max_steps=3000, max_minutes=8, learning_rate=1e-3,
                                      min_learning_rate=1e-4, warmup_steps=200, eval_every=500, eval_batch_size=128,
                                      autocast_bfloat16=False)
RESTORATION_RECIPES = (
    Recipe(
        name="shakespeare-restore-transformer",
        architecture="seq2seq",
        # pre-norm with final norms (trains without a long warmup), sinusoidal positions, one embedding for source,
        # target and output scaled by sqrt(d) as fairseq's
        model=MappingProxyType(dict(d_model=192, encoder_layers=3, decoder_layers=2, n_heads=4, encoder_ffn=768,
                                    decoder_ffn=768, max_source_len=128, max_seq_len=128, activation="relu",
                                    pre_norm=True, final_norm=True, embed_scale=192 ** 0.5)),
        training=RESTORATION_TRAINING,
        task="restoration",
    ),
    Recipe(
        name="shakespeare-restore-fconv",
        architecture="fconv_seq2seq",
        # fairseq's fconv_iwslt_de_en shape (4 encoder, 3 decoder convolutions of width 3) at 192 wide
        model=MappingProxyType(dict(encoder_embed_dim=192, decoder_embed_dim=192, out_embed_dim=192,
                                    share_input_output_embed=True, encoder_layers=[[192, 3, 1]] * 4,
                                    decoder_layers=[[192, 3, 1]] * 3, max_source_len=128, max_seq_len=128)),
        # perplexity 5.7 after 400 steps at 3e-3, 88 at 1e-3 (the Transformer: 13.7 at either)
        training=replace(RESTORATION_TRAINING, learning_rate=3e-3),
        task="restoration",
    ),
    Recipe(
        name="shakespeare-restore-lstm",
        architecture="rnn_seq2seq",
        # OpenNMT-py's default RNN model (bidirectional encoder, general attention, input feeding) at 192 wide
        model=MappingProxyType(dict(hidden_size=192, layers=2, source_embed_dim=192, target_embed_dim=192,
                                    bidirectional=True, global_attention="general", share_decoder_embeddings=True,
                                    max_source_len=128, max_seq_len=128)),
        # a higher rate, as the LSTM language model's: perplexity 3.4 after 400 steps at 5e-3, 6.7 at 3e-3
        training=replace(RESTORATION_TRAINING, learning_rate=5e-3, min_learning_rate=2e-4),
        task="restoration",
        embedding_std=None,
    ),
)

BYTE_LANGUAGE_MODEL_RECIPES = (
    Recipe(
        name="shakespeare-char-lstm",
        architecture="lstm",
        # Karpathy's char-rnn: a 2-layer LSTM over bytes, here 448 wide (~2.8M parameters). Windows of 512 bytes,
        # so that the held-out windows, each started from a zero state, cost little.
        model=MappingProxyType(dict(d_embed=128, d_hidden=448, n_layers=2, d_proj=128, tie_embeddings=True)),
        training=TrainingConfig(context=512, batch_size=16, max_steps=1500, max_minutes=8, learning_rate=6e-3,
                                warmup_steps=30, eval_every=500, eval_batch_size=32, autocast_bfloat16=False),
        task="byte-language-model",
        embedding_std=None,
    ),
)

DEFAULT_RECIPES = LANGUAGE_MODEL_RECIPES + RESTORATION_RECIPES + BYTE_LANGUAGE_MODEL_RECIPES


def recipe_names() -> list[str]:
    return [recipe.name for recipe in DEFAULT_RECIPES]


def get_recipe(name: str) -> Recipe:
    for recipe in DEFAULT_RECIPES:
        if recipe.name == name:
            return recipe
    raise KeyError(f"unknown recipe {name!r} (known: {', '.join(recipe_names())})")
