"""The ASGI application: routers, error handlers, request counters, OpenAPI."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi

from wakeline.api import errors
from wakeline.api.context import ApiContext
from wakeline.api.routes import control, observe, ops, records

log = logging.getLogger("wakeline.api")

DESCRIPTION = """\
The HTTP surface of Wakeline: records in, triggers and their freshness out.

Every data endpoint needs `Authorization: Bearer <token>`; each token belongs to one
workspace (operator configuration) and never reads, writes or enqueues in another.
Errors are JSON: `{"error": {"code", "message", "field", "location", "errors"}}`.
`GET /document` is stale-while-revalidate: it answers at once and, when the data is
dirty or older than `max_staleness`, enqueues a run without waiting for it.
"""


def create_app(ctx: ApiContext) -> FastAPI:
    app = FastAPI(title="Wakeline", version="0.1.0", description=DESCRIPTION)
    app.state.ctx = ctx
    app.state.requests = Counter()
    lock = threading.Lock()
    errors.install(app)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return errors.error_response(500, "internal", f"internal error: {type(exc).__name__}")

    @app.middleware("http")
    async def _count(request: Request, call_next: Callable[[Request], Awaitable[Response]]
                     ) -> Response:
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        with lock:
            app.state.requests[(request.method, path, str(response.status_code))] += 1
        return response

    for r in (records.router, observe.router, control.router, ops.router):
        app.include_router(r)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
                "type": "http", "scheme": "bearer",
                "description": "one token per workspace (operator configuration)"}
            schema["security"] = [{"bearer": []}]
            _document_errors(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


_ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
        "code": {"type": "string"}, "message": {"type": "string"},
        "field": {"type": ["string", "null"]}, "location": {"type": ["string", "null"]},
        "errors": {"type": "array", "items": {"type": "object"}}}}}}


def _document_errors(schema: dict[str, Any]) -> None:
    """Every operation answers JSON errors in one shape; say so in the document."""
    schema["components"].setdefault("schemas", {})["Error"] = _ERROR_SCHEMA
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            codes = ["401", "403", "404", "409", "422", "503"]
            if path in ("/healthz",):
                codes = ["503"]
            for code in codes:
                responses[code] = {"description": "error", **ref}
            if method == "get" and path in ("/metrics", "/dashboard/data", "/healthz"):
                op["security"] = [{"bearer": []}, {}]
