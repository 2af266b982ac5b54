"""vLLM's GET /tokenizer_info: a hosted model's tokenizer configuration, so that a client tokenizes through the
server (/tokenize, /detokenize: tokenize.py) instead of loading the tokenizer itself. lm-evaluation-harness's
`local-completions` model does that (`tokenizer_backend=remote`, which it picks by itself when this route answers
with an `eos_token` and /tokenize answers too): it reads `eos_token`, `bos_token` and `chat_template` here and
finds their ids by tokenizing those strings.

vLLM answers with the tokenizer's `init_kwargs` (tokenizer_config.json as transformers read it, file names
dropped, AddedToken objects as their strings), `tokenizer_class`, and the server's chat template. So does this
route, with what the server itself uses laid over the file: the special tokens it resolved (`eos_token` from the
id config.json names, where the files name none), whether encoding adds BOS, the longest sequence it serves, and
the template chats render with. `?model=NAME` picks a hosted model (vLLM hosts one); without it, the default
model, which is also the one lm-eval's /tokenize and /detokenize calls reach, since they name no model.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from quill.models.loading.errors import read_json_object
from quill.server.hosting import HostedModel

from ..errors import OPENAI_ERROR_RESPONSES
from ..generation import resolve_model

router = APIRouter()

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
DEFAULT_TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # what transformers loads a bare tokenizer.json as


def _plain(value):
    """JSON as a client reads tokenizer settings: an AddedToken object (a special token, an entry of
    added_tokens_decoder) as its string."""
    if isinstance(value, dict):
        if isinstance(value.get("content"), str):
            return value["content"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def tokenizer_info(hosted: HostedModel) -> dict:
    loaded = hosted.loaded
    file = loaded.path / TOKENIZER_CONFIG_FILE if loaded.path is not None else None
    saved = read_json_object(file) if file is not None and file.is_file() else {}
    # file names mean nothing to a client; the chat template is the one the server renders with, below
    info = {k: _plain(v) for k, v in saved.items() if not k.endswith("_file") and k != "chat_template"}
    info["tokenizer_class"] = saved.get("tokenizer_class") or DEFAULT_TOKENIZER_CLASS
    info.update(loaded.special_tokens)
    if "eos_token" not in info and loaded.eos_token_ids:
        eos = loaded.tokenizer.id_to_token(loaded.eos_token_ids[0])
        if eos is not None:
            info["eos_token"] = eos
    info["add_bos_token"] = loaded.add_bos_token
    info["model_max_length"] = hosted.max_model_len
    if hosted.chat_template is not None:
        info["chat_template"] = hosted.chat_template.source
    return info


@router.get("/tokenizer_info", responses=OPENAI_ERROR_RESPONSES)
async def get_tokenizer_info(http: Request, model: str | None = None):
    return tokenizer_info(resolve_model(http, model))
