"""What a request gets for the settings it leaves out: the checkpoint's recommendations from its
generation_config.json (vLLM's `--generation-config auto`; none with `--generation-config none`),
then Quill's own defaults.

Every dialect fills its left-out settings here, so a setting left out means the same whichever
route the request came by. A dialect passes None for what the client did not send.
"""

from __future__ import annotations

from quill.server.config import ServerConfig
from quill.server.hosting import HostedModel

# The sampling settings a checkpoint may recommend (LoadedModel.generation_defaults has these keys, and max_tokens).
RECOMMENDABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def fill_sampling_settings(hosted: HostedModel, settings: dict) -> dict:
    """SamplingParams keywords with the ones left out (None) filled by the checkpoint's recommendation,
    or dropped so that SamplingParams' own default applies. Beam search ranks raw log-probabilities:
    it takes no recommended sampling settings."""
    recommended = {} if settings.get("use_beam_search") else hosted.loaded.generation_defaults
    filled = {}
    for name, value in settings.items():
        if value is None and name in RECOMMENDABLE:
            value = recommended.get(name)
        if value is not None:
            filled[name] = value
    return filled


def default_max_tokens(hosted: HostedModel, config: ServerConfig, num_prompt_tokens: int,
                       fallback: int | None = None) -> int:
    """max_tokens for a request that names none: the checkpoint's recommendation, else `fallback` (the
    dialect's own default), else all the context leaves. Never more than the context leaves or the
    server's limit, so a default never fails a request whose prompt fits (at least 1: a prompt that
    fills the context is refused by the context check, naming both numbers)."""
    wanted = hosted.loaded.generation_defaults.get("max_tokens", fallback)
    room = hosted.max_model_len - num_prompt_tokens
    return max(1, min(room, config.max_tokens_limit, room if wanted is None else wanted))
