"""Architecture name -> (config class, model class)."""

from .fconv import FConvConfig, FConvLanguageModel
from .gcnn import GCNNConfig, GCNNLanguageModel
from .lstm import LSTMConfig, LSTMLanguageModel
from .scripted import ScriptedConfig, ScriptedModel
from .transformer import TransformerConfig, TransformerLanguageModel

ARCHITECTURES = {
    "lstm": (LSTMConfig, LSTMLanguageModel),
    "gcnn": (GCNNConfig, GCNNLanguageModel),
    "fconv": (FConvConfig, FConvLanguageModel),  # fairseq's fconv_lm, read by models.classic.fairseq_fconv
    "transformer": (TransformerConfig, TransformerLanguageModel),
    "scripted": (ScriptedConfig, ScriptedModel),  # no compute: for measuring the engine and the server
}
