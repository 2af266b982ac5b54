"""Quill, one import package: `quill.server` (the HTTP server and its engine), `quill.models` (the architectures,
checkpoint loading, tokenizers), `quill.clients` (the client library and `quill bench`), `quill.cli` (the `quill`
command). The client is also here under the product's name (`quill.Client`, `quill.AsyncClient`, ...), imported on
first use, so that importing the server or a model never imports the client."""

from importlib import import_module

__all__ = ["AsyncClient", "Client", "Choice", "Completion", "Logprobs", "ModelInfo", "QuillConnectionError",
           "QuillError", "Usage", "wait_until_ready"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(import_module("quill.clients"), name)
    raise AttributeError(f"module 'quill' has no attribute {name!r}")
