"""Wakeline: a declarative trigger engine on a streaming log."""

from wakeline import _compiled

# Before any compiled module is imported: a build older than its source is skipped.
_compiled.install()

from wakeline.errors import WakelineError  # noqa: E402

__version__ = "0.1.0"

__all__ = ["WakelineError", "__version__"]
