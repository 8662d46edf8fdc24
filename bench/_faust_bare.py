"""A bare Faust agent over a topic (the second reference of stream_throughput.py).

Run as ``python bench/_faust_bare.py worker -l warn --without-web`` with ``BARE_TOPIC``,
``BARE_BOOTSTRAP`` and ``BARE_EXPECT`` in the environment: it iterates the topic's
events doing nothing else, with the conditions worker's consumer settings, and prints
``bare-result {"n": N, "seconds": S, "rate": R}`` once it has seen ``BARE_EXPECT``.
"""

from __future__ import annotations

import json
import os
import time

import faust

TOPIC, BOOTSTRAP = os.environ["BARE_TOPIC"], os.environ["BARE_BOOTSTRAP"]
EXPECT = int(os.environ["BARE_EXPECT"])
app = faust.App(f"bare-{os.getpid()}", broker=f"kafka://{BOOTSTRAP}", store="memory://",
                web_enabled=False, consumer_auto_offset_reset="earliest",
                stream_buffer_maxsize=16384, broker_max_poll_records=2000,
                topic_allow_declare=False, datadir=f"/tmp/wl-bench-bare-{os.getpid()}")
topic = app.topic(TOPIC, key_serializer="raw", value_serializer="raw")
seen = {"n": 0, "t0": 0.0}


@app.agent(topic)
async def bare(stream: faust.StreamT) -> None:
    async for _ in stream.events():
        if seen["n"] == 0:
            seen["t0"] = time.perf_counter()
        seen["n"] += 1
        if seen["n"] >= EXPECT:
            dt = time.perf_counter() - seen["t0"]
            # os.write: the Faust worker redirects print() into its log
            os.write(1, ("bare-result " + json.dumps({"n": seen["n"], "seconds": dt,
                                                      "rate": seen["n"] / dt}) + "\n").encode())
            os._exit(0)


if __name__ == "__main__":
    app.main()
