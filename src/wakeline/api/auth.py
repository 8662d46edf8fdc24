"""Bearer tokens, one per workspace (operator configuration, :mod:`wakeline.api.config`).

Every data endpoint depends on :func:`principal`: the token names the workspace,
and a request naming another workspace is refused (403).  Lookups by id
(``/runs/{id}``, ``/jobs/{id}``) answer 404 for another workspace's rows, so a
token cannot even learn that they exist.  Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request

from wakeline.api.errors import Forbidden, Unauthorized

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="wakeline"'}


@dataclass(frozen=True)
class Principal:
    workspace: str

    def check(self, workspace: str | None, field: str = "workspace",
              location: str = "body") -> str:
        """The workspace a request acts in: its own; naming another one is denied."""
        if workspace is not None and workspace != self.workspace:
            raise Forbidden(f"this token acts in workspace {self.workspace!r}, not "
                            f"{workspace!r}", field=field, location=location)
        return self.workspace


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise Unauthorized("missing Authorization: Bearer <token>", code="auth.missing",
                           field="Authorization", location="header", headers=_CHALLENGE)
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the Authorization header must be 'Bearer <token>'",
                           field="Authorization", location="header", headers=_CHALLENGE)
    return token.strip()


def principal(request: Request) -> Principal:
    token = _bearer(request).encode()
    found = None
    for workspace, secret in request.app.state.ctx.settings.tokens.items():
        if hmac.compare_digest(token, secret.get_secret_value().encode()):
            found = workspace
    if found is None:
        raise Unauthorized("unknown token", field="Authorization", location="header",
                           headers=_CHALLENGE)
    return Principal(found)


def operator(request: Request) -> None:
    """The cross-workspace operational surface: the operator token, when one is set."""
    secret = request.app.state.ctx.settings.operator_token
    if secret is None:
        return
    if not hmac.compare_digest(_bearer(request).encode(), secret.get_secret_value().encode()):
        raise Unauthorized("this needs the operator token", field="Authorization",
                           location="header", headers=_CHALLENGE)
