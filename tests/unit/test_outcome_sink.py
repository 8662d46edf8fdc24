"""How the outcome writer serializes an outcome's detail for COPY."""

from __future__ import annotations

import json

from wakeline.streams.sinks import _dumps


def test_details_serialize_as_the_same_json_python_would_write() -> None:
    for detail in ({"value": 3.5, "threshold": 10.0, "comparison": "gte", "records": 2},
                   {"census": [1, 2], "who": "mïa 🚀", "none": None}, {}):
        assert json.loads(_dumps(detail)) == detail


def test_what_orjson_refuses_falls_back_to_json_dumps() -> None:
    big = {"value": 2**70, 3: "int key"}
    assert json.loads(_dumps(big)) == {"value": 2**70, "3": "int key"}
