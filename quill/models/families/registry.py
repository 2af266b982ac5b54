"""Architecture name -> (config class, model class)."""

from .fconv import FConvConfig, FConvLanguageModel
from .fconv_seq2seq import FConvSeq2Seq, FConvSeq2SeqConfig
from .gcnn import GCNNConfig, GCNNLanguageModel
from .lfm2 import Lfm2Config, Lfm2LanguageModel
from .lstm import LSTMConfig, LSTMLanguageModel
from .mamba import MambaConfig, MambaLanguageModel
from .mamba2 import Mamba2Config, Mamba2LanguageModel
from .rnn_seq2seq import RNNSeq2Seq, RNNSeq2SeqConfig
from .scripted import ScriptedConfig, ScriptedModel
from .seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from .transformer import TransformerConfig, TransformerLanguageModel
from .xlstm import XLSTMConfig, XLSTMLanguageModel

ARCHITECTURES = {
    "lstm": (LSTMConfig, LSTMLanguageModel),
    "gcnn": (GCNNConfig, GCNNLanguageModel),
    "fconv": (FConvConfig, FConvLanguageModel),  # fairseq's fconv_lm, read by models.classic.fairseq_fconv
    "transformer": (TransformerConfig, TransformerLanguageModel),
    "lfm2": (Lfm2Config, Lfm2LanguageModel),  # Hugging Face LFM2: conv windows in slots, K,V in blocks
    "mamba2": (Mamba2Config, Mamba2LanguageModel),  # Hugging Face Mamba2ForCausalLM
    "xlstm": (XLSTMConfig, XLSTMLanguageModel),  # Hugging Face xLSTMForCausalLM, read by models.hf_families
    "mamba": (MambaConfig, MambaLanguageModel),  # Mamba-1 and Falcon-Mamba (Hugging Face checkpoints)
    "seq2seq": (Seq2SeqConfig, Seq2SeqTransformer),  # encoder-decoder: Marian, BART, mBART, M2M100 (Hugging Face)
    "rnn_seq2seq": (RNNSeq2SeqConfig, RNNSeq2Seq),  # OpenNMT-py's RNN encoder-decoders, read by models.classic.opennmt
    "fconv_seq2seq": (FConvSeq2SeqConfig, FConvSeq2Seq),  # fairseq's fconv translation models (fairseq_fconv_mt)
    "scripted": (ScriptedConfig, ScriptedModel),  # no compute: for measuring the engine and the server
}
