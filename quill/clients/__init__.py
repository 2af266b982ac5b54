"""Python client for Quill's HTTP API."""

from .client import AsyncClient, Client
from .errors import QuillConnectionError, QuillError
from .ready import wait_until_ready
from .types import Choice, Completion, Logprobs, ModelInfo, Usage

__all__ = ["AsyncClient", "Client", "Choice", "Completion", "Logprobs", "ModelInfo", "QuillConnectionError",
           "QuillError", "Usage", "wait_until_ready"]
