"""The root of Wakeline's exception hierarchy.

    WakelineError                      (code "wakeline")
    ├── ConfigError                    bad configuration or settings
    │   └── catalog.errors.CatalogError    an invalid catalog (file, YAML path, rule)
    ├── ServiceError                   a service could not start / is not ready
    │   └── PrerequisiteMissing        a tool the service needs is not installed
    └── StoreError                     PostgreSQL schema / store problems

Every class carries a stable ``code``; context is keyword-only.  The CLI maps
errors to exit status 2 and prints ``error[<code>]: <message>``.
"""

from __future__ import annotations

from typing import Any, ClassVar

_REGISTRY: dict[str, type[WakelineError]] = {}


class WakelineError(Exception):
    """Base class of every error Wakeline raises on purpose."""

    code: ClassVar[str] = "wakeline"

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("code")
        if code:
            _REGISTRY[code] = cls

    def __str__(self) -> str:
        return self.message


def lookup(code: str) -> type[WakelineError]:
    """Return the error class registered for ``code`` (KeyError if unknown)."""
    return _REGISTRY[code]


class ConfigError(WakelineError):
    code = "config"


class ServiceError(WakelineError):
    code = "service"


class PrerequisiteMissing(ServiceError):
    code = "service.prerequisite"


class ServiceTimeout(ServiceError):
    code = "service.timeout"


class StoreError(WakelineError):
    code = "store"
