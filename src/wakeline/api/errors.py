"""API errors: every failure answers JSON with a stable code and the failing field.

    ApiError                         (code, HTTP status, field)
    ├── Unauthorized                 401 auth.missing / auth.invalid
    ├── Forbidden                    403 auth.workspace_denied
    ├── NotFound                     404 <thing>.not_found, derivation.unknown, ...
    ├── Conflict                     409 e.g. store.no_live_head
    └── Invalid                      422 a value the schema allows but the catalog does not

Bodies look like ``{"error": {"code", "message", "field", "location", "errors"}}``;
request validation failures (pydantic) are 422 ``request.invalid`` with every
failing field in ``errors``.  Input that reaches PostgreSQL and is refused there
as bad data (class 22) is a 422 too: bad input never answers 5xx.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from wakeline.errors import WakelineError

log = logging.getLogger("wakeline.api")


class ApiError(Exception):
    status = 400
    code = "request.bad"

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None,
                 location: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.code
        self.field = field
        self.location = location
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "field": self.field,
                          "location": self.location, "errors": []}}


class Unauthorized(ApiError):
    status = 401
    code = "auth.invalid"


class Forbidden(ApiError):
    status = 403
    code = "auth.workspace_denied"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class Invalid(ApiError):
    status = 422
    code = "request.invalid"


class Unavailable(ApiError):
    """A service the request needs is down (not the caller's fault)."""

    status = 503
    code = "service.unavailable"


def _loc(loc: tuple[Any, ...] | list[Any]) -> tuple[str | None, str | None]:
    parts = [str(p) for p in loc]
    location = parts[0] if parts and parts[0] in ("body", "query", "path", "header") else None
    rest = parts[1:] if location else parts
    return location, ".".join(rest) or None


def error_response(status: int, code: str, message: str, field: str | None = None,
                   location: str | None = None, errors: list[dict[str, Any]] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, headers=headers, content={"error": {
        "code": code, "message": message, "field": field, "location": location,
        "errors": errors or []}})


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.field, exc.location,
                              headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for e in exc.errors():
            location, field = _loc(e.get("loc", ()))
            errors.append({"field": field, "location": location, "message": e.get("msg", ""),
                           "type": e.get("type", "")})
        first = errors[0] if errors else {"field": None, "location": None, "message": "invalid"}
        return error_response(422, "request.invalid",
                              f"{first['field'] or first['location'] or 'request'}: "
                              f"{first['message']}", first["field"], first["location"], errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "route.not_found", 405: "method.not_allowed"}.get(exc.status_code,
                                                                       "request.bad")
        return error_response(exc.status_code, code, str(exc.detail),
                              headers=getattr(exc, "headers", None))

    @app.exception_handler(psycopg.errors.DataError)
    async def _data(request: Request, exc: psycopg.errors.DataError) -> JSONResponse:
        # Class 22: PostgreSQL refused a value (out of range, bad encoding): bad input.
        diag = exc.diag.message_primary or str(exc)
        return error_response(422, "input.invalid", f"the database refused a value: {diag}")

    @app.exception_handler(psycopg.OperationalError)
    async def _db_down(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
        log.warning("database unavailable: %s", exc)
        return error_response(503, "database.unavailable",
                              "PostgreSQL is unavailable; retry shortly")

    @app.exception_handler(WakelineError)
    async def _wakeline(request: Request, exc: WakelineError) -> JSONResponse:
        status = 422 if exc.code.startswith(("store.invalid", "catalog")) else 409 \
            if exc.code.startswith("store.") else 500
        return error_response(status, exc.code, exc.message,
                              str(exc.context.get("field")) if exc.context.get("field") else None)
