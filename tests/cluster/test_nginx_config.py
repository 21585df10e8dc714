"""The shipped deploy/nginx/cosyserve.conf: what the cluster tests render from it, checked by `nginx -t`."""

from __future__ import annotations

import re

import pytest

from tests.support.nginx import SHIPPED, Nginx, render

pytestmark = [pytest.mark.cluster]


def test_render_keeps_every_setting_and_lists_each_replica_as_primary_and_backup(tmp_path):
    ups = ["127.0.0.1:1001", "127.0.0.1:1002"]
    out = render(ups, 9999)
    servers = re.findall(r"^\s*server (\S+) ([^;]*);", out, re.MULTILINE)
    assert servers == [(u, "max_fails=3 fail_timeout=2s") for u in ups] + [(u, "max_fails=0 backup") for u in ups]
    assert "listen 127.0.0.1:9999;" in out
    shipped_settings = [line for line in SHIPPED.read_text().splitlines()
                        if line.strip() and not re.match(r"\s*(server \S+:\d+|listen )", line)]
    assert [line for line in out.splitlines() if line in shipped_settings] == shipped_settings  # all kept, in order
    Nginx(tmp_path, ups).check()  # nginx itself accepts it


def test_synthesis_retries_503_on_the_next_replica_and_nothing_else_resends_a_post():
    text = SHIPPED.read_text()
    synth = re.search(r"location ~ \^/\(v1/tts\|v1/audio/speech\|inference_\[a-z0-9_\]\+\)\$ \{(.*?)\}", text,
                      re.DOTALL)
    assert synth is not None
    assert "proxy_next_upstream error timeout http_503 non_idempotent;" in synth.group(1)
    assert re.findall(r"^\s*proxy_next_upstream .*$", text, re.MULTILINE) == [
        "    proxy_next_upstream error timeout;", "        proxy_next_upstream error timeout http_503 non_idempotent;"]
    assert "proxy_buffering off;" in text and "least_conn;" in text
