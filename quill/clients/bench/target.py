"""The server under test: refuse hosts that are not this machine, list its models (encoder-decoders with their
languages and source limit), probe their tokenizers."""

from __future__ import annotations

import ipaddress
import random
from urllib.parse import urlsplit

from quill.clients.client import Client
from quill.clients.errors import QuillError
from quill.clients.types import ModelInfo

from .workload import make_prompt


def require_loopback(url: str, allow_remote: bool) -> None:
    """A load generator can hurt a shared server: only loopback addresses unless asked (no DNS lookups)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url must be an http(s) URL, got {url!r}")
    if allow_remote:
        return
    host = parts.hostname
    try:
        is_loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        is_loopback = host.lower() == "localhost"
    if not is_loopback:
        raise ValueError(f"{url} is not a loopback address; `quill bench` generates heavy load, "
                         "pass --allow-remote to bench a server on another host")


def hosted_models(client: Client, wanted: list[str] | None) -> list[ModelInfo]:
    """The server's models, or those of `wanted` (in that order); an unknown name is an error."""
    hosted = {m.id: m for m in client.models()}
    if not wanted:
        return list(hosted.values())
    unknown = [w for w in wanted if w not in hosted]
    if unknown:
        raise ValueError(f"the server does not host {', '.join(unknown)} (it hosts {', '.join(hosted)})")
    return [hosted[w] for w in wanted]


def model_languages(model: ModelInfo, source_lang: str | None,
                    target_langs: list[str] | None) -> tuple[str | None, tuple[str, ...]]:
    """The source language and the target languages to cycle through of `model`'s requests: those asked for
    (--source-lang, --target-lang), else no source and every language the model lists. A decoder-only model gets
    none; a code the model does not list is an error (a model that lists none decides itself)."""
    if not model.encoder_decoder:
        return None, ()
    targets = tuple(target_langs) if target_langs else tuple(model.languages)
    unknown = [code for code in (source_lang, *targets) if code and model.languages and code not in model.languages]
    if unknown:
        raise ValueError(f"{model.id} does not take the language(s) {', '.join(unknown)}; it takes "
                         f"{', '.join(model.languages)}")
    return source_lang, targets


def count_prompt_tokens(client: Client, model: str, prompt: str, max_tokens: int = 1, **languages) -> int:
    """The server's own count, from a short completion (an encoder-decoder's: its source tokens)."""
    return client.complete(prompt, model=model, max_tokens=max_tokens, temperature=0, **languages).usage.prompt_tokens


def tokens_per_word(client: Client, model: ModelInfo, source_lang: str | None = None,
                    target_lang: str | None = None) -> float:
    """How many tokens a word of the bench's prompts costs with this model's tokenizer (one probe request)."""
    num_words = max(4, min(64, (model.max_source_len or model.max_model_len or 256) // 8))
    languages = {k: v for k, v in (("source_lang", source_lang), ("target_lang", target_lang)) if v}
    max_tokens = 2 if target_lang else 1  # a target language may be forced as the first token, which counts
    while True:
        prompt = make_prompt(random.Random(12345), num_words)
        try:
            return count_prompt_tokens(client, model.id, prompt, max_tokens, **languages) / num_words
        except QuillError as e:
            if e.status == 400 and e.param in ("source_lang", "target_lang"):
                raise ValueError(f"{model.id} refused the bench's languages ({e.message}); name them with "
                                 "--source-lang and --target-lang") from None
            if e.status != 400 or num_words == 1:
                raise
            num_words //= 2  # a tokenizer that splits words finely: the probe itself was too long
