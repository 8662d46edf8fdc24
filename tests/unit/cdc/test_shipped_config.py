"""The connector configuration the project ships is the one the code uses."""

from __future__ import annotations

import json
from pathlib import Path

from wakeline.cdc.debezium import SHIPPED_PATH, config_from_dsn, shipped_json

ROOT = Path(__file__).resolve().parents[3]


def test_connect_file_is_generated_from_connector_config() -> None:
    text = (ROOT / SHIPPED_PATH).read_text()
    assert text == shipped_json(), (
        "connect/wakeline-postgres.json is stale: regenerate it with "
        "python -c 'from wakeline.cdc.debezium import shipped_json; "
        "open(\"connect/wakeline-postgres.json\", \"w\").write(shipped_json())'")


def test_the_settings_the_contract_depends_on() -> None:
    conf = json.loads(shipped_json())["config"]
    assert conf["plugin.name"] == "pgoutput"
    assert conf["publication.name"] == "wakeline"
    assert conf["publication.autocreate.mode"] == "disabled"
    assert conf["message.key.columns"] == (
        "public.records:workspace,entity;public.derivation_cursors:workspace,entity")
    assert conf["value.converter.replace.null.with.default"] == "false"
    assert conf["tombstones.on.delete"] == "false"
    assert conf["decimal.handling.mode"] == "string"
    assert conf["transforms.route.replacement"] == "wakeline.changes"
    assert conf["key.converter.schemas.enable"] == conf["value.converter.schemas.enable"] == "false"


def test_config_from_dsn() -> None:
    conf = config_from_dsn("postgresql://bob:s3cret@db.example:6543/app", topic="x.changes",
                           slot="s1")
    assert (conf["database.hostname"], conf["database.port"], conf["database.user"],
            conf["database.password"], conf["database.dbname"]) == (
        "db.example", "6543", "bob", "s3cret", "app")
    assert conf["transforms.route.replacement"] == "x.changes" and conf["slot.name"] == "s1"
