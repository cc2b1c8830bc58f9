"""The one kubelet endpoint a process node serves: container logs, so `kubectl logs` works.

Why: when a real trainer rank fails on a process node, the first thing anyone types is
`kubectl logs`. The apiserver proxies that to `https://<node InternalIP>:<kubeletEndpoint
port>/containerLogs/<ns>/<pod>/<container>`; it does not verify the kubelet's certificate
unless `--kubelet-certificate-authority` is set (the local cluster does not set it), so a
self-signed certificate on 127.0.0.1 is enough. Logs are the files the agent writes, one
per container, appended across restarts; as a kubelet does, a request gets the current run of the
container (from the offset where it started, `<container>.log.starts`) and `previous=true` the
run before it.
`follow=true` streams as a kubelet does: until the container stops running (the stream then
ends, after its last bytes), the client goes away, or `FOLLOW_LIMIT_S` passes. `kubectl logs -f`
and the client's `logs(follow=True)` rely on that end to notice a restarted or replaced pod.
"""

from __future__ import annotations

import datetime as dt
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

FOLLOW_LIMIT_S = 3600.0


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "process-node")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "kubelet.crt", directory / "kubelet.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def find_log(pods_dir: Path, ns: str, pod: str, container: str) -> Path | None:
    """The newest log of that container (pod dirs are `<ns>_<pod>_<uid>`)."""
    logs = [d / f"{container}.log" for d in pods_dir.glob(f"{ns}_{pod}_*") if (d / f"{container}.log").exists()]
    return max(logs, key=lambda p: p.stat().st_mtime, default=None)


Running = Callable[[Path, str], bool]
"""`running(pod_dir, container)`: whether that container of the pod in `pod_dir` runs now."""


def _run_bounds(log: Path, previous: bool) -> tuple[int, int | None]:
    """The byte range of the current (or previous) run of the container within its log file."""
    starts_file = log.with_name(log.name + ".starts")
    starts = [int(s) for s in starts_file.read_text().split()] if starts_file.exists() else [0]
    if not previous:
        return starts[-1], None
    return (starts[-2], starts[-1]) if len(starts) > 1 else (starts[-1], starts[-1])


class _Handler(BaseHTTPRequestHandler):
    pods_dir: Path
    running: Running | None = None

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        query = urllib.parse.parse_qs(url.query)
        log = find_log(self.pods_dir, *parts[1:4]) if len(parts) == 4 and parts[0] == "containerLogs" else None
        if log is None:
            self.send_error(404, "no such container log")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        data = log.read_bytes()
        offset = len(data)  # what was read, not the size now: bytes written since are streamed below
        begin, end = _run_bounds(log, previous=query.get("previous", ["false"])[0] == "true")
        data = data[begin:end]
        if "tailLines" in query:
            data = b"".join(data.splitlines(keepends=True)[-int(query["tailLines"][0]) :])
        self.wfile.write(data)
        if query.get("follow", ["false"])[0] != "true" or end is not None:
            return
        deadline = time.monotonic() + FOLLOW_LIMIT_S
        while time.monotonic() < deadline:
            alive = self.running is None or self.running(log.parent, parts[3])  # asked before the read: no lost tail
            with open(log, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            if chunk:
                offset += len(chunk)
                try:
                    self.wfile.write(chunk)
                    self.wfile.flush()
                except OSError:
                    return
            elif not alive:
                return  # the container had stopped and its last bytes are sent: the stream ends
            time.sleep(0.3)


def serve_logs(pods_dir: Path, running: Running | None = None) -> tuple[ThreadingHTTPServer, int]:
    """Start the log server on 127.0.0.1 (free port) in a daemon thread; returns it and its port.
    With `running`, a followed log ends when its container stops (else it streams until the limit)."""
    attributes = {"pods_dir": pods_dir, "running": staticmethod(running) if running else None}
    handler = type("Handler", (_Handler,), attributes)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory(prefix="ftjob-kubelet-") as tmp:
        context.load_cert_chain(*_self_signed(Path(tmp)))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="kubelet-api", daemon=True).start()
    return server, int(server.server_address[1])
