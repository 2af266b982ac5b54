"""The playground's routes without a browser: the page and its files are served (and shipped), they
load nothing from elsewhere, GET / points at the page, and the page stays open under an API key
while the API and TGI's POST / do not."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import httpx

from quill.server.api.app import create_app
from quill.server.api.playground_routes import ASSETS
from quill.server.hosting import ModelHost
from tests.server.api.conftest import server_config

ROOT = Path(__file__).resolve().parents[3]
PAGE_DIR = ROOT / "quill" / "server" / "api" / "playground"


async def test_page_and_its_files_are_served(client):
    page = await client.get("/playground")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for name, media_type in ASSETS.items():
        r = await client.get(f"/playground/{name}")
        assert r.status_code == 200 and r.headers["content-type"] == media_type, name
        assert r.content == (PAGE_DIR / name).read_bytes()
    # Every file the page or its scripts name is one the route serves.
    named = set(re.findall(r'(?:src|href)="playground/([^"]+)"', page.text))
    named |= set(re.findall(r'from "\./([^"]+)"', (PAGE_DIR / "playground.js").read_text()))
    assert named and named <= set(ASSETS)
    assert set(ASSETS) | {"index.html"} == {p.name for p in PAGE_DIR.iterdir()}


async def test_the_page_loads_nothing_from_elsewhere(client):
    page = await client.get("/playground")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    for path in ["/playground"] + [f"/playground/{name}" for name in ASSETS]:
        text = (await client.get(path)).text
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), f"{path} names another host"


async def test_unknown_files_are_not_served(client):
    for path in ("/playground/nope.js", "/playground/..%2Fapp.py", "/playground/index.html/x"):
        assert (await client.get(path)).status_code == 404, path


async def test_index_points_at_the_playground(client):
    as_json = await client.get("/")
    assert as_json.status_code == 200 and as_json.json()["links"]["playground"] == "playground"
    as_html = await client.get("/", headers={"Accept": "text/html"})
    assert as_html.headers["content-type"].startswith("text/html") and 'href="playground"' in as_html.text
    # POST / is still TGI's route.
    tgi = await client.post("/", json={"inputs": "To be", "parameters": {"max_new_tokens": 2}})
    assert tgi.status_code == 200 and "generated_text" in tgi.json()[0]


async def test_page_is_open_under_an_api_key_and_the_api_is_not(tiny_checkpoints):
    config = server_config(tiny_checkpoints, api_keys=["k1"])
    host = ModelHost.load(config)
    host.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(host, config)),
                                     base_url="http://t") as c:
            for path in ("/", "/playground", "/playground/playground.js"):
                assert (await c.get(path)).status_code == 200, path
            assert (await c.head("/playground")).status_code == 200
            assert (await c.post("/", json={"inputs": "x"})).status_code == 401
            assert (await c.get("/v1/models")).status_code == 401
            assert (await c.get("/playground", headers={"Authorization": "Bearer wrong"})).status_code == 200
    finally:
        host.shutdown()


def test_the_page_ships_with_the_package():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = package_data["quill.server"]
    for path in PAGE_DIR.iterdir():
        relative = path.relative_to(ROOT / "quill" / "server").as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} is not package data"
