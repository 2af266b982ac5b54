"""tokenizer_config.json and the chat templates a checkpoint ships: the special tokens'
strings and the Jinja templates that turn chat messages into a prompt.

Read as transformers 5 reads them: chat_template.jinja and additional_chat_templates/*.jinja
take priority over a `chat_template` in tokenizer_config.json (a string, or a list of
named templates); special tokens come from tokenizer_config.json, then the legacy
special_tokens_map.json. Whether BOS is added is not read here: tokenizer.json's
post-processor decides it, as it does in transformers 5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..loading.errors import CheckpointError, read_json_object

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
# The named special tokens; chat templates see each under its name (transformers' special_tokens_map).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
DEFAULT_TEMPLATE = "default"


@dataclass
class TokenizerConfig:
    special_tokens: dict[str, str] = field(default_factory=dict)  # "bos_token" -> "<s>", ...
    chat_templates: dict[str, str] = field(default_factory=dict)  # name -> Jinja source; the main one is "default"

    @property
    def chat_template(self) -> str | None:
        return self.chat_templates.get(DEFAULT_TEMPLATE)


def _read_object(path: Path) -> dict:
    return read_json_object(path) if path.is_file() else {}


def _token_string(path: Path, name: str, value) -> str | None:
    """A special token is saved as its string, or as an AddedToken object with a "content"."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise CheckpointError(path, f"{name} must be a string or an object with a \"content\" string, got {value!r}")


def _templates_in_config(path: Path, value) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, str):
        return {DEFAULT_TEMPLATE: value}
    if isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in value
    ):
        return {t["name"]: t["template"] for t in value}
    raise CheckpointError(path, "chat_template must be a string or a list of {\"name\", \"template\"} objects")


def read_tokenizer_config(directory: Path) -> TokenizerConfig:
    """Special tokens and chat templates of the checkpoint in `directory`; empty where it ships none."""
    config_path = directory / TOKENIZER_CONFIG_FILE
    config = _read_object(config_path)
    legacy_path = directory / SPECIAL_TOKENS_MAP_FILE
    legacy = _read_object(legacy_path)
    special = {}
    for name in SPECIAL_TOKEN_NAMES:
        token = _token_string(config_path, name, config.get(name))
        if token is None:
            token = _token_string(legacy_path, name, legacy.get(name))
        if token is not None:
            special[name] = token

    files = {}
    if (directory / CHAT_TEMPLATE_FILE).is_file():
        files[DEFAULT_TEMPLATE] = (directory / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    if (directory / CHAT_TEMPLATE_DIR).is_dir():
        for file in sorted((directory / CHAT_TEMPLATE_DIR).glob("*.jinja")):
            files[file.stem] = file.read_text(encoding="utf-8")
    templates = files or _templates_in_config(config_path, config.get("chat_template"))
    return TokenizerConfig(special, templates)
