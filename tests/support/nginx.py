"""docker/nginx/default.conf in a real nginx in front of a backend on this host, for tests.

Only the addresses change (the backend, ports on 127.0.0.1, the certificate folder); the rest
is the file compose mounts. ``NGINX_BIN`` names the binary when it is not on PATH; ``NGINX``
is None when there is none.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
from pathlib import Path

from tests.support.stack import ROOT, free_port, wait_for

NGINX = os.environ.get("NGINX_BIN") or shutil.which("nginx") or (
    "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def nginx_version() -> tuple[int, ...]:
    out = subprocess.run([NGINX, "-v"], capture_output=True, text=True).stderr
    return tuple(int(p) for p in re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", out).groups())


class Nginx:
    """nginx with the deployed config in front of ``127.0.0.1:backend_port`` (and of
    ``api_port`` for ``/v1``, the same backend unless given)."""

    def __init__(self, tmp: Path, backend_port: int, api_port: int | None = None):
        self.tmp = tmp
        certs = tmp / "certs"
        script = tmp / "make-cert.sh"  # the script writes beside itself
        shutil.copy(ROOT / "docker/nginx/make-self-signed-cert.sh", script)
        subprocess.run(["bash", str(script), "127.0.0.1"], check=True, capture_output=True)
        self.ca = str(certs / "tls.crt")
        self.http_port, self.port = free_port(), free_port()
        conf = (ROOT / "docker/nginx/default.conf").read_text()
        conf = conf.replace("server web:8080;", f"server 127.0.0.1:{backend_port};")
        conf = conf.replace("server api:8080;", f"server 127.0.0.1:{api_port or backend_port};")
        conf = re.sub(r"^\s*listen \[::\]:\d+( ssl)?;\n", "", conf, flags=re.M)
        conf = conf.replace("listen 80;", f"listen 127.0.0.1:{self.http_port};")
        conf = conf.replace("/etc/nginx/certs/", f"{certs}/")
        if nginx_version() < (1, 25, 1):  # `http2 on;` is newer than this nginx
            conf = conf.replace("http2 on;", "")
            conf = conf.replace("listen 443 ssl;", f"listen 127.0.0.1:{self.port} ssl http2;")
        else:
            conf = conf.replace("listen 443 ssl;", f"listen 127.0.0.1:{self.port} ssl;")
        (tmp / "default.conf").write_text(conf)
        temp = {name: tmp / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
        (tmp / "nginx.conf").write_text(f"""
{"user root;" if os.geteuid() == 0 else ""}
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{}}
http {{
    access_log off;
    {"".join(f"{n}_temp_path {p};" if n != "body" else f"client_body_temp_path {p};" for n, p in temp.items())}
    include {tmp}/default.conf;
}}
""")
        self.checked = subprocess.run([NGINX, "-t", "-p", str(tmp), "-c", str(tmp / "nginx.conf")],
                                      capture_output=True, text=True)
        self.proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        wait_for(self._listening, 15, what="nginx")
        self.https = f"https://127.0.0.1:{self.port}"
        self.http = f"http://127.0.0.1:{self.http_port}"

    def _listening(self) -> bool:
        assert self.proc.poll() is None, self.proc.stderr.read().decode()
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def tls_connect(self, source: str = "127.0.0.1", timeout: float = 10) -> ssl.SSLSocket:
        """A TLS connection from ``source`` (any 127.x address: nginx's limits are per address)."""
        ctx = ssl.create_default_context(cafile=self.ca)
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout,
                                       source_address=(source, 0))
        return ctx.wrap_socket(raw, server_hostname="127.0.0.1")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=15)
