"""Operator configuration of the HTTP API (pydantic-settings, prefix ``WAKELINE_API_``).

Sources, in order of precedence: keyword arguments (what ``wakeline api --config
FILE`` reads from its YAML file), then the environment, e.g.::

    WAKELINE_API_TOKENS='{"default": "s3cret", "acme": "other"}'
    WAKELINE_API_OPERATOR_TOKEN=ops-token

``tokens`` maps each workspace to its bearer token: a token reads, writes and
enqueues in its own workspace only.  ``operator_token`` guards the cross-workspace
operational surface (``/metrics``, ``/dashboard/data``); when it is unset that
surface is open (a local, loopback-only deployment).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from wakeline.errors import ConfigError


class ApiConfigInvalid(ConfigError):
    code = "api.config_invalid"


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WAKELINE_API_", extra="forbid", frozen=True)

    tokens: dict[str, SecretStr] = Field(default_factory=dict,
                                         description="workspace -> bearer token")
    operator_token: SecretStr | None = None
    #: How long a read waits for the conditions agent's freshness answer before it
    #: answers from PostgreSQL alone (the read stimulus is in the log either way).
    reply_timeout_s: float = Field(default=2.0, gt=0, le=60)
    #: How long a manual run waits for the mailbox's job id before answering 202
    #: ``pending`` with its request id (``GET /requests/{id}`` has the answer later).
    manual_timeout_s: float = Field(default=5.0, gt=0, le=120)
    #: ``auto`` asks the broker (Tansu names its cluster ``tansu_cluster``).
    broker_kind: Literal["auto", "kafka", "tansu"] = "auto"
    #: Consumer groups the dashboard always shows (Tansu does not list groups).
    consumer_groups: list[str] = Field(default_factory=list)
    dashboard_refresh_s: float = Field(default=2.0, gt=0, le=300)

    @field_validator("tokens")
    @classmethod
    def _distinct(cls, v: dict[str, SecretStr]) -> dict[str, SecretStr]:
        values = [t.get_secret_value() for t in v.values()]
        if any(not t for t in values):
            raise ValueError("a workspace token may not be empty")
        if len(set(values)) != len(values):
            raise ValueError("two workspaces share one token: give each its own")
        return v


def load_settings(path: str | Path | None = None, **overrides: Any) -> ApiSettings:
    """Settings from the environment, the YAML file ``path`` and ``overrides``."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ApiConfigInvalid(f"{p}: cannot read API config: {exc}", file=str(p)) from exc
        if not isinstance(loaded, dict):
            raise ApiConfigInvalid(f"{p}: the API config must be a mapping", file=str(p))
        data.update(loaded)
    data.update(overrides)
    try:
        return ApiSettings(**data)
    except ValidationError as exc:
        lines = [f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}"
                 for e in exc.errors()]
        raise ApiConfigInvalid("invalid API config: " + "; ".join(lines)) from exc
