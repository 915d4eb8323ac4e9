"""The server's one error shape, OpenAI's `{"error": {"message", "type", "param", "code"}}`, for every error:
ours (`ApiError`), an invalid body (FastAPI's validation), an unknown route (Starlette's), and a failure
of our own (a 500).

The OpenAPI schema documents those 400s in place of the 422 responses FastAPI adds to routes with a
body (`openapi_schema`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from exactspec.server.schemas import served_schema


class ApiError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def row_error(error: str | None, param: str | None) -> ApiError:
    """The error a row that ended with "error" answers: a 400 naming the field when the request was at
    fault (a structure its matcher could not enforce to the end: `RowEvent.error_param`), else a 500."""
    if param is not None:
        return ApiError(400, str(error), param=param, code="invalid_value")
    return ApiError(500, f"generation failed: {error}", type="server_error")


def add_error_handlers(app: FastAPI, rejected: Callable[[int], None]) -> None:
    """Answer every error of `app` in OpenAI's shape; `rejected(status)` hears each refused request (4xx,
    and our own `ApiError`s)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        rejected(error.status)
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        location = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(location) or None
        message = (
            f"{param}: {first.get('msg', 'invalid request')}" if param else first.get("msg", "invalid body")
        )
        return await api_error(request, ApiError(400, message, param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return await api_error(request, ApiError(error.status_code, str(error.detail), code=code))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        return ApiError(
            500, f"internal error: {type(error).__name__}: {error}", type="server_error"
        ).response()


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, less the 422 responses it adds to routes with a body: this server answers an
    invalid body with a 400 in OpenAI's error shape (`add_error_handlers`), which the routes document
    instead."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for unused in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(unused, None)
        service = app.state.service
        app.openapi_schema = served_schema(schema, service.model_name, service.pair.target.vocab_size)
    return app.openapi_schema
