"""`import quill`: the client library under its product name (`quill.Client`, `quill.AsyncClient`)."""

from clients import *  # noqa: F401,F403
from clients import __all__  # noqa: F401
