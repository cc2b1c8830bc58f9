"""Readiness probes of the containers a process node runs (exec, tcpSocket, httpGet)."""

from __future__ import annotations

import socket
import subprocess
import time

import requests

from finetune_localcluster.pod_runs import Container, PodRun


def probe(run: PodRun, c: Container) -> bool:
    """Readiness of a running container: exec, tcpSocket or httpGet, at the probe's period."""
    p = c.spec.get("readinessProbe")
    if not p:
        return True
    t = time.monotonic()
    if t < c.probe_at or t - c.started_mono < p.get("initialDelaySeconds", 0):
        return c.ready
    c.probe_at = t + p.get("periodSeconds", 10)
    timeout = min(float(p.get("timeoutSeconds", 1)), 2.0)
    spec = p.get("tcpSocket") or p.get("httpGet") or {}
    port = spec.get("port", 0)
    if isinstance(port, str) and not port.isdigit():
        port = next((q["containerPort"] for q in c.spec.get("ports", []) if q.get("name") == port), 0)
    host = spec.get("host") or run.ip
    try:
        if "exec" in p and c.proc is not None:
            argv = ["nsenter", f"--target={c.proc.pid}", "--mount", "--uts", "--", *p["exec"]["command"]]
            done = subprocess.run(argv, check=False, env=c.env, timeout=timeout, capture_output=True)
            return done.returncode == 0
        if "tcpSocket" in p:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            return True
        if "httpGet" in p:
            url = f"http://{host}:{int(port)}{spec.get('path', '/')}"
            return 200 <= requests.get(url, timeout=timeout, proxies={"http": ""}).status_code < 400
    except (OSError, subprocess.SubprocessError, requests.RequestException):
        return False
    return False
