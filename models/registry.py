"""Architecture name -> (config class, model class)."""

from .gcnn import GCNNConfig, GCNNLanguageModel
from .lstm import LSTMConfig, LSTMLanguageModel
from .scripted import ScriptedConfig, ScriptedModel
from .transformer import TransformerConfig, TransformerLanguageModel

ARCHITECTURES = {
    "lstm": (LSTMConfig, LSTMLanguageModel),
    "gcnn": (GCNNConfig, GCNNLanguageModel),
    "transformer": (TransformerConfig, TransformerLanguageModel),
    "scripted": (ScriptedConfig, ScriptedModel),  # no compute: for measuring the engine and the server
}
