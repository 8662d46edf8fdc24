"""The package's public surface: sorted, importable, documented."""

from __future__ import annotations

import wakeline.cdc as cdc
from wakeline.cdc import errors
from wakeline.errors import lookup


def test_all_is_sorted_and_importable() -> None:
    assert cdc.__all__ == sorted(cdc.__all__)
    for name in cdc.__all__:
        assert getattr(cdc, name) is not None


def test_error_codes_are_registered() -> None:
    for cls in (errors.NotJson, errors.NotAnEnvelope, errors.MissingField, errors.UnknownTable,
                errors.UnknownOp, errors.BadValue, errors.Oversized, errors.PgOutputError,
                errors.RelayError, errors.ConnectorError):
        assert lookup(cls.code) is cls
        assert issubclass(cls, errors.CdcError)
