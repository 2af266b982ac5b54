"""The server under test: refuse hosts that are not this machine, list its models, probe their tokenizers."""

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


def count_prompt_tokens(client: Client, model: str, prompt: str) -> int:
    """The server's own count, from a one-token completion."""
    return client.complete(prompt, model=model, max_tokens=1, temperature=0).usage.prompt_tokens


def tokens_per_word(client: Client, model: ModelInfo) -> float:
    """How many tokens a word of the bench's prompts costs with this model's tokenizer (one probe request)."""
    num_words = max(4, min(64, (model.max_model_len or 256) // 8))
    while True:
        prompt = make_prompt(random.Random(12345), num_words)
        try:
            return count_prompt_tokens(client, model.id, prompt) / num_words
        except QuillError as e:
            if e.status != 400 or num_words == 1:
                raise
            num_words //= 2  # a tokenizer that splits words finely: the probe itself was too long
