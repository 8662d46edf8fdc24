"""``wakeline api`` serves the API for a topology from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.streaming import ROOT, make_stack
from tests.unit.core.helpers import catalog_dir, derivation
from wakeline.services.ports import free_port

pytestmark = pytest.mark.integration


def test_wakeline_api_serves_the_topology_with_the_configured_tokens(
        pg_server: Any, tansu_broker: Any, tmp_path: Path) -> None:
    cat = catalog_dir(tmp_path, {"wr": derivation("wr", "write: {}",
                                                  source="collections: [relations]")})
    st = make_stack(pg_server, tmp_path, tansu_broker.bootstrap, cat)
    config = tmp_path / "api.yaml"
    config.write_text("tokens: {default: cli-token}\n")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "wakeline.cli.main", "api", "--topology", str(st.topology),
         "--catalog", str(cat), "--dsn", st.dsn, "--bootstrap", st.bootstrap,
         "--config", str(config), "--port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()  # type: ignore[union-attr]
            time.sleep(0.2)
        auth = {"Authorization": "Bearer cli-token"}
        r = httpx.post(url + "/records", headers=auth, json={
            "entity": "e:cli", "collection": "relations", "type": "support", "ready": True})
        assert r.status_code == 201, r.text
        assert httpx.get(url + "/runs").status_code == 401
        triggers = httpx.get(url + "/triggers", headers=auth).json()
        assert list(triggers["triggers"]) == ["wr.default"]
        assert httpx.get(url + "/openapi.json").json()["info"]["title"] == "Wakeline"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        st.store.close()
    assert f"api       {url}" in out
