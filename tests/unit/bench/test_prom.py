"""bench/lib/prom.py reads the text the server writes: sums over label sets, or one entry a label set."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from bench.lib.prom import parse_samples


def exposition() -> str:
    reg = CollectorRegistry()
    heap = Gauge("process_heap_bytes", "heap", ["state"], registry=reg)
    heap.labels("in_use").set(500.0)
    heap.labels("free").set(20.0)
    Counter("tts_requests", "requests", ["route", "note"], registry=reg).labels("/v1/tts", 'a "quoted" {x}').inc(3)
    Gauge("tts_admission_limit", "limit", registry=reg).set(float("nan"))
    return generate_latest(reg).decode()


def test_samples_sum_over_their_label_sets():
    s = parse_samples(exposition())
    assert s["process_heap_bytes"] == 520.0 and s["tts_requests_total"] == 3.0
    assert "tts_admission_limit" not in s  # NaN: left out


def test_labels_name_each_set_as_the_server_writes_it():
    s = parse_samples(exposition(), labels=True)
    assert s['process_heap_bytes{state="in_use"}'] == 500.0 and s['process_heap_bytes{state="free"}'] == 20.0
    assert s['tts_requests_total{note="a \\"quoted\\" {x}",route="/v1/tts"}'] == 3.0
    assert "process_heap_bytes" not in s
