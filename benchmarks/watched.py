"""A manager being watched: the status page open and Prometheus scraping, once a second.

``watching(url)`` runs a separate process that does what an open page and a scraper ask
of the manager: ``GET /api/dashboard`` (the page's poll) and ``GET /metrics`` once a
second each, on kept-alive connections, as a browser and Prometheus do. The browser's own
rendering is not part of it: it runs on the viewer's machine, not the manager's.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator

POLLER = r"""
import http.client, json, sys, threading, time, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
conns = {p: http.client.HTTPConnection(url.hostname, url.port, timeout=10)
         for p in ("/metrics", "/api/dashboard")}
took = []
def round_():
    for path, conn in conns.items():
        begin = time.perf_counter()
        conn.request("GET", path)
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 200, answer.status
        took.append(time.perf_counter() - begin)
round_()
took.clear()  # a first round before the clock starts, so that the connections are open
print("ready", flush=True)
while not stop.wait(1.0):
    round_()
took.sort()
print(json.dumps({"requests": len(took),
                  "median_ms": took[len(took) // 2] * 1e3 if took else 0.0,
                  "max_ms": took[-1] * 1e3 if took else 0.0}), flush=True)
"""


@contextlib.contextmanager
def watching(url: str) -> Iterator[dict[str, float]]:
    """While in the block, the page's poll and a scrape hit ``url`` once a second each
    (their first round comes before the block, and is not counted); after it, the dict
    holds how many requests were made in the block and how long they took."""
    poller = subprocess.Popen(
        [sys.executable, "-c", POLLER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert poller.stdout is not None and poller.stdin is not None
    found: dict[str, float] = {}
    try:
        assert poller.stdout.readline().strip() == "ready", "the poller did not start"
        yield found
    finally:
        out, _ = poller.communicate(input="", timeout=30)
    found.update(json.loads(out.strip().splitlines()[-1]))
