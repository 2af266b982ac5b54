"""deploy/compose/ and the nginx template it mounts: `docker compose config` (offline, no engine),
every file it mounts exists, its QUILL_* variables are real flags, and nginx accepts the template
rendered for loopback replicas (`nginx -t`)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, REPO, quill_env_vars, require_tool
from tests.deploy.nginx_proxy import PLACEHOLDERS, TEMPLATE, check_config, render_template, write_config

COMPOSE = DEPLOY / "compose"
FILES = {"cpu": [COMPOSE / "compose.yaml"], "gpu": [COMPOSE / "compose.yaml", COMPOSE / "compose.gpu.yaml"]}


def compose_config(files) -> dict:
    """The merged, interpolated model as `docker compose config` prints it (JSON)."""
    compose = require_tool("docker-compose")
    args = [compose, "--project-directory", str(COMPOSE)]
    for f in files:
        args += ["-f", str(f)]
    result = subprocess.run(args + ["config", "--format", "json"], capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(REPO)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module", params=sorted(FILES))
def stack(request):
    return request.param, compose_config(FILES[request.param])


def test_compose_config_is_valid(stack):
    variant, config = stack
    services = config["services"]
    assert set(services) == {"quill", "nginx", "prometheus", "grafana"}
    quill = services["quill"]
    assert quill["build"]["args"]["VARIANT"] == ("cuda" if variant == "gpu" else "cpu")
    assert quill["environment"]["QUILL_DEVICE"] == ("cuda" if variant == "gpu" else "cpu")
    assert int(quill["deploy"]["replicas"]) >= 1
    if variant == "gpu":
        (device,) = quill["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["count"] == 1
    assert services["nginx"]["depends_on"]["quill"]["condition"] == "service_healthy"


def test_mounted_files_exist(stack):
    _, config = stack
    for name, service in config["services"].items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                assert (COMPOSE / volume["source"]).resolve().exists(), f"{name}: {volume['source']} missing"
    build = config["services"]["quill"]["build"]
    assert (COMPOSE / build["context"] / build["dockerfile"]).resolve() == (REPO / "Dockerfile")


def test_quill_settings_are_real_flags_and_drain_fits_the_grace_period(stack):
    _, config = stack
    quill = config["services"]["quill"]
    assert set(k for k in quill["environment"] if k.startswith("QUILL_")) <= quill_env_vars()
    grace = quill["stop_grace_period"]
    assert re.fullmatch(r"\d+s", grace) and int(grace[:-1]) >= float(quill["environment"]["QUILL_DRAIN_SECONDS"]) + 5
    probe = quill["healthcheck"]["test"]
    assert probe[0] == "CMD" and "/ready" in probe[-1]  # compose health gates nginx: ready, not merely alive
    compile(probe[-1], "healthcheck", "exec")


def test_nginx_service_renders_the_shared_template(stack):
    _, config = stack
    nginx = config["services"]["nginx"]
    (mount,) = [v for v in nginx["volumes"] if v["type"] == "bind"]
    assert (COMPOSE / mount["source"]).resolve() == TEMPLATE
    assert mount["target"].startswith("/etc/nginx/templates/") and mount["target"].endswith(".conf.template")
    used = set(re.findall(r"\$\{(\w+)\}", TEMPLATE.read_text()))
    assert used == set(PLACEHOLDERS) and used <= set(nginx["environment"])
    listen = nginx["environment"]["NGINX_LISTEN"]
    assert any(p["target"] == int(listen) for p in nginx["ports"])
    assert nginx["environment"]["QUILL_UPSTREAM"] == "quill:8000"


def test_prometheus_scrapes_each_replica(stack):
    _, config = stack
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "quill"]
    (sd,) = job["dns_sd_configs"]
    port = int(config["services"]["nginx"]["environment"]["QUILL_UPSTREAM"].split(":")[1])
    assert sd["names"] == ["quill"] and sd["type"] == "A" and sd["port"] == port  # one target per replica
    assert job.get("metrics_path", "/metrics") == "/metrics"


# ---- the nginx template ----------------------------------------------------------------------

def test_render_repeats_the_server_line_per_replica():
    template = TEMPLATE.read_text()
    text = render_template(template, ["127.0.0.1:1", "127.0.0.1:2"], "127.0.0.1:3")
    servers = re.findall(r"^\s*server (\S+) max_fails=\d+ fail_timeout=\d+s;$", text, re.M)
    assert servers == ["127.0.0.1:1", "127.0.0.1:2"]
    assert "listen 127.0.0.1:3;" in text and "${" not in text
    with pytest.raises(ValueError):
        render_template(template + "${OTHER}", ["a:1"], "1")
    with pytest.raises(ValueError):
        render_template(template, [], "1")


def test_template_has_the_proxy_contract():
    directives = {" ".join(line.split()) for line in TEMPLATE.read_text().splitlines()
                  if line.strip() and not line.strip().startswith("#")}
    for needed in ("least_conn;", "proxy_http_version 1.1;", 'proxy_set_header Connection "";',
                   "proxy_buffering off;", "proxy_cache off;", "proxy_request_buffering on;",
                   "proxy_next_upstream error timeout http_502 http_503 non_idempotent;"):
        assert needed in directives, needed
    assert re.search(r"^\s*keepalive \d+;", TEMPLATE.read_text(), re.M)
    read_timeout = re.search(r"proxy_read_timeout (\d+)s;", TEMPLATE.read_text())
    assert int(read_timeout.group(1)) >= 300  # a whole non-streaming generation comes before its header


def test_envsubst_leaves_nginx_variables_alone():
    """The nginx image's envsubst replaces every $NAME that is a defined environment variable; nginx's own
    variables are lowercase, environment variables here uppercase, so only the placeholders change."""
    code = "\n".join(line for line in TEMPLATE.read_text().splitlines() if not line.lstrip().startswith("#"))
    names = set(re.findall(r"\$\{?(\w+)", code))
    assert {n for n in names if not n.islower()} == set(PLACEHOLDERS)


def test_nginx_accepts_the_rendered_config(tmp_path):
    nginx = require_tool("nginx")
    conf = write_config(tmp_path, ["127.0.0.1:18001", "127.0.0.1:18002"], "127.0.0.1:18000")
    result = check_config(nginx, tmp_path, conf)
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr
