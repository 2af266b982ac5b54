"""One error type for the whole API, rendered in the dialect of the route that raised it.

OpenAI routes (/v1/..., and vLLM's /tokenize, /detokenize and /tokenizer_info) answer {"error": {"message", "type",
"param", "code"}}; TGI routes answer {"error", "error_type"}.
"""

from __future__ import annotations

from fastapi import Request
from pydantic import BaseModel
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    408: "request_timeout",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}
TGI_ERROR_TYPES = {400: "validation", 401: "authentication", 404: "not_found", 408: "timeout", 413: "validation",
                   415: "validation", 429: "overloaded", 500: "generation", 503: "unavailable"}


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(BaseModel):
    error: OpenAIErrorDetail


class TGIErrorBody(BaseModel):
    error: str
    error_type: str


_STATUSES = (400, 401, 404, 408, 413, 429, 500, 503)
OPENAI_ERROR_RESPONSES = {s: {"model": OpenAIErrorBody} for s in _STATUSES}  # for the OpenAPI document
TGI_ERROR_RESPONSES = {s: {"model": TGIErrorBody} for s in _STATUSES}
SSE_RESPONSE = {200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"}}
JSON_OR_SSE_RESPONSE = {200: {"content": {"application/json": {}, "text/event-stream": {}},
                              "description": "JSON, or Server-Sent Events when the request streams"}}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, reason: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers
        self.reason = reason or ERROR_TYPES.get(status, "error")  # the label of quill_request_errors_total


# vLLM's routes outside /v1/, answered in OpenAI's shape as vLLM does
VLLM_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")


def is_openai_path(path: str) -> bool:
    return path.startswith("/v1/") or path in VLLM_PATHS


def error_body(path: str, status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    if is_openai_path(path):
        return {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"), "param": param, "code": code}}
    return {"error": message, "error_type": TGI_ERROR_TYPES.get(status, "error")}


def error_response(request: Request, error: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(request.url.path, error.status, error.message, error.param, error.code),
        status_code=error.status, headers=error.headers,
    )


def unrecognized(params: list[str]) -> APIError:
    """A request field no schema declares, in OpenAI's words for it; `params` are dotted paths."""
    plural = "s" if len(params) > 1 else ""
    return APIError(400, f"Unrecognized request argument{plural} supplied: {', '.join(params)}", param=params[0],
                    reason="invalid_request")


def _loc_to_param(loc) -> str | None:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or None


def install_error_handlers(app, on_error=None) -> None:
    """`on_error(request, APIError)`, if given, sees every error answered (for metrics)."""

    def answer(request: Request, error: APIError) -> JSONResponse:
        if on_error is not None:
            on_error(request, error)
        return error_response(request, error)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        # Unknown fields first: a misspelled one usually explains the others (a "promt" leaves "prompt" missing).
        unknown = [_loc_to_param(e["loc"]) or '""' for e in exc.errors() if e.get("type") == "extra_forbidden"]
        if unknown:
            return answer(request, unrecognized(list(dict.fromkeys(unknown))))
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = _loc_to_param(first.get("loc", ()))
        if first.get("type") == "json_invalid":
            param = None
            message = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}"
        else:
            message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
        return answer(request, APIError(400, message, param=param, reason="invalid_request"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return answer(request, APIError(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return answer(request, APIError(500, f"internal error: {type(exc).__name__}", reason="internal"))
