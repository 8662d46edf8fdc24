"""Wakeline: a declarative trigger engine on a streaming log."""

from wakeline.errors import WakelineError

__version__ = "0.1.0"

__all__ = ["WakelineError", "__version__"]
