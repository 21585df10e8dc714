"""/metrics read back: every sample of a TestClient's scrape, one series from the text, a live server's."""

from __future__ import annotations

import re

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.server import ServerProcess


def scrape(client: TestClient) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics as {(name, sorted labels): value}; also checks it parses."""
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def metric(text: str, name: str) -> float:
    """One unlabelled series' value in a /metrics text."""
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def metrics(srv: ServerProcess) -> dict[str, float]:
    """A live server's /metrics as {series with its labels, as written: value}."""
    out = {}
    for line in httpx.get(srv.base_url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
