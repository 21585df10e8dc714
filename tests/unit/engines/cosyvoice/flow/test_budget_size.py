"""The flow cache budget's default size: a share of the memory free at load, within a container's limit."""

from __future__ import annotations

import pytest

from app.engines.cosyvoice.flow import budget


def _host(tmp_path, meminfo_kib: int | None, cgroup: dict[str, str] | None = None):
    (tmp_path / "proc").mkdir()
    if meminfo_kib is not None:
        (tmp_path / "proc/meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {meminfo_kib} kB\n")
    for rel, text in (cgroup or {}).items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return str(tmp_path)


def test_host_memory_available_without_a_limit(tmp_path):
    root = _host(tmp_path, 8 * 2**20, {"sys/fs/cgroup/memory.max": "max", "sys/fs/cgroup/memory.current": "123"})
    assert budget.host_free_bytes(root) == 8 * 2**30


@pytest.mark.parametrize("files", [
    {"sys/fs/cgroup/memory.max": str(3 * 2**30), "sys/fs/cgroup/memory.current": str(2**30)},  # cgroup v2
    {"sys/fs/cgroup/memory/memory.limit_in_bytes": str(3 * 2**30),
     "sys/fs/cgroup/memory/memory.usage_in_bytes": str(2**30)},  # cgroup v1
])
def test_a_container_limit_below_the_host_wins(tmp_path, files):
    assert budget.host_free_bytes(_host(tmp_path, 8 * 2**20, files)) == 2 * 2**30


def test_a_cgroup_v1_without_a_limit_is_ignored(tmp_path):
    files = {"sys/fs/cgroup/memory/memory.limit_in_bytes": str(2**63 - 4096),
             "sys/fs/cgroup/memory/memory.usage_in_bytes": str(2**30)}
    assert budget.host_free_bytes(_host(tmp_path, 4 * 2**20, files)) == 4 * 2**30


def test_nothing_readable_falls_back_to_a_fixed_size(tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "host_free_bytes", lambda root="/": None)
    size, how = budget.auto_budget_bytes("cpu")
    assert size == budget.FALLBACK_BYTES and "no free-memory figure" in how


def test_the_default_is_a_quarter_of_what_is_free(monkeypatch):
    monkeypatch.setattr(budget, "host_free_bytes", lambda root="/": 10 * 2**30)
    size, how = budget.auto_budget_bytes("cpu")
    assert size == int(10 * 2**30 * budget.AUTO_SHARE) and "25% of 10.0 GiB host memory" in how
    monkeypatch.undo()
    assert (budget.host_free_bytes() or 0) > 0  # the real reading on this machine


def test_usage_is_reported_on_every_change():
    seen = []
    b = budget.FlowCacheBudget(1000, per_frame=10, on_usage=lambda *a: seen.append(a))
    assert b.admit(1, 400) and not b.admit(2, 700)
    b.settle(1, 300)
    b.release(1)
    assert seen == [(400, 1000, 1), (300, 1000, 1), (0, 1000, 0)]
