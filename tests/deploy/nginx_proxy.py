"""deploy/nginx/quill.conf.template rendered for loopback replicas, and Debian's nginx running it as the
current user from a temporary prefix. The compose deployment mounts the same template into the nginx
image, which renders it the same way (envsubst), so the tested directives are the deployed ones."""

from __future__ import annotations

import grp
import os
import pwd
import re
import signal
import subprocess
from pathlib import Path

from quill.clients.ready import wait_until_ready
from tests.deploy.conftest import DEPLOY

TEMPLATE = DEPLOY / "nginx" / "quill.conf.template"
PLACEHOLDERS = ("QUILL_UPSTREAM", "NGINX_LISTEN")


def render_template(template: str, upstreams: list[str], listen: str) -> str:
    """The template with ${NGINX_LISTEN} filled and the `server ${QUILL_UPSTREAM} ...;` line repeated once
    per upstream address (the container names one DNS name that resolves to every replica instead)."""
    if not upstreams:
        raise ValueError("at least one upstream")
    lines = []
    for line in template.splitlines():
        if "${QUILL_UPSTREAM}" in line and not line.lstrip().startswith("#"):
            lines += [line.replace("${QUILL_UPSTREAM}", address) for address in upstreams]
        else:
            lines.append(line.replace("${QUILL_UPSTREAM}", ", ".join(upstreams)))
    text = "\n".join(lines).replace("${NGINX_LISTEN}", listen) + "\n"
    leftover = re.findall(r"\$\{\w+\}", text)
    if leftover:
        raise ValueError(f"placeholders the template does not define: {leftover}")
    return text


def main_config(prefix: Path, include: str) -> str:
    """The outer nginx.conf: everything that differs between a container and a temp dir (paths, the
    user), around the shared http-context include. The X-Upstream-Addr header lets the test see which
    replica served a response; the deployed template has no such header."""
    temp_paths = "\n".join(f"    {kind}_temp_path {prefix / kind};" for kind in
                           ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    user = ""
    if os.geteuid() == 0:  # as root, workers would switch to `nobody`; keep them the current user
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
    return f"""{user}
daemon off;
worker_processes 1;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} info;
events {{
    worker_connections 256;
}}
http {{
    access_log {prefix / "access.log"};
{temp_paths}
    add_header X-Upstream-Addr $upstream_addr always;
    include {include};
}}
"""


def write_config(prefix: Path, upstreams: list[str], listen: str) -> Path:
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / "quill.conf").write_text(render_template(TEMPLATE.read_text(), upstreams, listen))
    conf = prefix / "nginx.conf"
    conf.write_text(main_config(prefix, "quill.conf"))
    return conf


def nginx_command(nginx: str, prefix: Path, conf: Path, *extra: str) -> list[str]:
    # -e: the startup error log, before the config's error_log is read (the default is under /var/log).
    return [nginx, "-p", f"{prefix}/", "-c", str(conf), "-e", str(prefix / "error.log"), *extra]


def check_config(nginx: str, prefix: Path, conf: Path) -> subprocess.CompletedProcess:
    return subprocess.run(nginx_command(nginx, prefix, conf, "-t"), capture_output=True, text=True, timeout=30)


class Nginx:
    """nginx in the foreground (daemon off), stopped by `stop()`."""

    def __init__(self, nginx: str, prefix: Path, upstreams: list[str], port: int):
        self.prefix = prefix
        self.url = f"http://127.0.0.1:{port}"
        conf = write_config(prefix, upstreams, f"127.0.0.1:{port}")
        self.process = subprocess.Popen(nginx_command(nginx, prefix, conf), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 10.0) -> None:
        try:
            wait_until_ready(self.url, timeout, path="/nginx-health", interval=0.05,
                             still_starting=lambda: self.process.poll() is None)
        except RuntimeError:
            raise RuntimeError(f"nginx exited: {self.error_log()}") from None
        except TimeoutError:
            raise TimeoutError(f"nginx not answering: {self.error_log()}") from None

    def error_log(self) -> str:
        log = self.prefix / "error.log"
        return log.read_text()[-4000:] if log.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # fast shutdown: open streams are closed
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
