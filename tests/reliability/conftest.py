"""The API fixtures (an in-process app over the tiny checkpoints, its client) serve these tests too."""

from tests.server.api.conftest import app, client  # noqa: F401
