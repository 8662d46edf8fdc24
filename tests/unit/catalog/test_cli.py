"""``wakeline catalog check|show|schema``: exit codes and output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.catalog.helpers import BASE, with_trigger, write_catalog
from wakeline.cli import main as cli_main

EXAMPLE = Path(__file__).resolve().parents[3] / "catalog"


@pytest.fixture(autouse=True)
def only_catalog_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # The entry point wires every command; other commands are built by others and
    # are irrelevant here, so run the real ``main`` with just this one registered.
    monkeypatch.setattr(cli_main, "COMMANDS", ["catalog"])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli_main.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def bad_catalog(tmp_path: Path) -> Path:
    return write_catalog(tmp_path / "bad", {
        **BASE, **with_trigger({"quiet": {"after_s": 0}, "cron": {"expr": "nope"}}),
    })


def test_check_ok(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "catalog", "check", str(EXAMPLE))
    assert rc == 0
    assert out.startswith("OK ")
    assert "9 collections, 8 derivations, 12 triggers" in out
    assert "sha256:" in out


def test_check_reports_every_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "catalog", "check", str(bad_catalog(tmp_path)))
    assert rc == 1
    lines = out.strip().splitlines()
    assert lines == [
        "derivations/d.yaml:trigger.cron.expr: [cron.invalid] " + lines[0].split("] ", 1)[1],
        "derivations/d.yaml:trigger.quiet.after_s: [duration.range] "
        + lines[1].split("] ", 1)[1],
    ]
    assert "2 issues" in err


def test_check_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "catalog", "check", "--json", str(bad_catalog(tmp_path)))
    assert rc == 1
    data = json.loads(out)
    assert data["ok"] is False
    assert [i["code"] for i in data["issues"]] == ["cron.invalid", "duration.range"]
    assert {"file", "path", "line", "message"} <= set(data["issues"][0])


def test_check_imports_functions_unless_told_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_catalog(tmp_path / "nofn", {**BASE, "mod.py": None})
    rc, out, _ = run(capsys, "catalog", "check", str(root))
    assert rc == 1 and "[function.unresolved]" in out
    rc, out, _ = run(capsys, "catalog", "check", "--no-import", str(root))
    assert rc == 0 and out.startswith("OK")


def test_check_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "catalog", "check", str(tmp_path / "nope"))
    assert rc == 2
    assert err.startswith("error[catalog.not_found]: ")


def test_show_prints_normalized_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "catalog", "show", str(EXAMPLE))
    assert rc == 0
    data = json.loads(out)
    assert "profile.nightly" in data["triggers"]
    assert data["triggers"]["profile.default"]["conditions"][0]["kind"] == "read"
    assert all(t["hash"].startswith("sha256:") for t in data["triggers"].values())
    rc, out, _ = run(capsys, "catalog", "show", str(EXAMPLE), "--trigger", "profile.nightly")
    assert rc == 0 and list(json.loads(out)["triggers"]) == ["profile.nightly"]
    rc, _, err = run(capsys, "catalog", "show", str(EXAMPLE), "--trigger", "nope")
    assert rc == 1 and "unknown trigger" in err


def test_show_invalid_catalog_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(capsys, "catalog", "show", str(bad_catalog(tmp_path)))
    assert rc == 2 and out == ""
    assert err.startswith("error[catalog.invalid]: ")
    assert "[cron.invalid]" in err and "[duration.range]" in err


def test_schema_all_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "catalog", "schema")
    assert rc == 0
    data = json.loads(out)
    assert set(data) == {"collection", "derivation", "trigger"}
    assert data["trigger"]["additionalProperties"] is False
    assert "transitions" in data["trigger"]["$defs"]["ChangedSpec"]["properties"]
    assert "in" in data["trigger"]["$defs"]["PredicateSpec"]["properties"]


def test_schema_one_kind_and_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "catalog", "schema", "--kind", "derivation")
    assert rc == 0 and json.loads(out)["title"].startswith("Wakeline derivation")
    rc, out, _ = run(capsys, "catalog", "schema", "--out", str(tmp_path / "schemas"))
    assert rc == 0
    written = sorted(p.name for p in (tmp_path / "schemas").iterdir())
    assert written == ["collection.schema.json", "derivation.schema.json", "trigger.schema.json"]
    assert json.loads((tmp_path / "schemas/trigger.schema.json").read_text())["type"] == "object"


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main.main(["catalog"])
    assert info.value.code == 2
