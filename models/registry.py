"""Architecture name -> (config class, model class)."""

from .fconv import FConvConfig, FConvLanguageModel
from .gcnn import GCNNConfig, GCNNLanguageModel
from .lstm import LSTMConfig, LSTMLanguageModel
from .mamba2 import Mamba2Config, Mamba2LanguageModel
from .scripted import ScriptedConfig, ScriptedModel
from .transformer import TransformerConfig, TransformerLanguageModel

ARCHITECTURES = {
    "lstm": (LSTMConfig, LSTMLanguageModel),
    "gcnn": (GCNNConfig, GCNNLanguageModel),
    "fconv": (FConvConfig, FConvLanguageModel),  # fairseq's fconv_lm, read by models.classic.fairseq_fconv
    "transformer": (TransformerConfig, TransformerLanguageModel),
    "mamba2": (Mamba2Config, Mamba2LanguageModel),  # Hugging Face Mamba2ForCausalLM
    "scripted": (ScriptedConfig, ScriptedModel),  # no compute: for measuring the engine and the server
}
