"""The playground's files are served by the app at / and /playground/ (the browser test drives them)."""

from __future__ import annotations

import re


def test_index_is_served_at_the_root(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    for element in ('id="text"', 'id="voice"', 'id="mode"', 'id="format"', 'id="priority"', 'id="speak"',
                    'id="stat-ttfa"', 'id="stat-rtf"', 'id="stat-class"', 'id="voice-file"', 'id="record"',
                    'id="api-key"'):
        assert element in r.text


def test_every_asset_the_page_names_is_served(client):
    page = client.get("/").text
    assets = re.findall(r'(?:src|href)="(playground/[^"]+)"', page)
    assert sorted(assets) == ["playground/playground.css", "playground/playground.js"]
    for asset in assets:
        r = client.get("/" + asset)
        assert r.status_code == 200 and len(r.content) > 500, asset
    assert "javascript" in client.get("/playground/playground.js").headers["content-type"]


def test_the_page_calls_the_api_by_relative_paths(client):
    """Relative URLs, so the page also works behind a reverse proxy's path prefix."""
    script = client.get("/playground/playground.js").text
    for path in ('"v1/speakers"', '"v1/tts"', '"v1/voices"'):
        assert path in script
    assert 'fetch("/' not in script


def test_unknown_asset_is_404_and_the_playground_is_not_in_the_api_schema(client):
    assert client.get("/playground/nope.js").status_code == 404
    paths = client.get("/openapi.json").json()["paths"]
    assert "/" not in paths and not any(p.startswith("/playground") for p in paths)
