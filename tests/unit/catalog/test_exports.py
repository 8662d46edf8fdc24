"""The public surface of ``wakeline.catalog`` and the editor JSON Schemas."""

from __future__ import annotations

import wakeline.catalog as catalog
from wakeline.catalog import CatalogInvalid, CatalogIssue, document_schemas
from wakeline.errors import ConfigError, lookup


def test_all_is_sorted_and_importable() -> None:
    assert catalog.__all__ == sorted(catalog.__all__)
    for name in catalog.__all__:
        assert getattr(catalog, name) is not None


def test_error_codes_are_registered() -> None:
    assert lookup("catalog.invalid") is CatalogInvalid
    assert issubclass(CatalogInvalid, ConfigError)


def test_catalog_invalid_carries_every_issue() -> None:
    issues = [
        CatalogIssue("b.yaml", "x", "cron.invalid", "fix b"),
        CatalogIssue("a.yaml", "y", "name.invalid", "fix a", 3),
    ]
    exc = CatalogInvalid(issues, root="cat")
    assert [i.file for i in exc.issues] == ["a.yaml", "b.yaml"]  # sorted by file, path
    assert exc.codes == ["name.invalid", "cron.invalid"]
    assert "a.yaml:y: [name.invalid] fix a (line 3)" in str(exc)
    assert exc.by_code("cron.invalid")[0].message == "fix b"
    assert exc.context == {"root": "cat"}


def test_document_schemas_forbid_unknown_keys() -> None:
    schemas = document_schemas()
    for kind, schema in schemas.items():
        assert schema["additionalProperties"] is False, kind
        assert schema["$schema"].startswith("https://json-schema.org/")
    assert set(schemas["trigger"]["properties"]) >= {
        "name", "processor", "write", "changed", "retraction", "accumulator", "census",
        "lifecycle", "quiet", "at", "cron", "read", "cooldown_s", "debounce_s", "max_wait_s",
    }
