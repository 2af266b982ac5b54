"""What a failed call raises: the server's status, message and error type."""

from __future__ import annotations


class QuillError(Exception):
    def __init__(self, status: int, message: str, error_type: str | None = None, param: str | None = None):
        super().__init__(f"{status} {error_type or 'error'}: {message}")
        self.status, self.message, self.error_type, self.param = status, message, error_type, param


class QuillConnectionError(QuillError):
    """The server could not be reached (or the connection broke before an answer)."""

    def __init__(self, message: str):
        super().__init__(0, message, "connection_error")


def error_from_response(status: int, body) -> QuillError:
    """Parse either dialect's error body; fall back to the raw text."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return QuillError(status, str(error.get("message")), error.get("type"), error.get("param"))
        if isinstance(error, str):
            return QuillError(status, error, body.get("error_type"))
    return QuillError(status, str(body))
