"""A minimal JSON client for the local apiserver, shared by the harness and the process node.

Why not the `kubernetes` package here: the harness and the node agent only need a handful of
verbs on plain dicts (create, get, list, merge-patch of status, delete with preconditions),
and working on raw JSON keeps the agent independent of the client's model classes and their
patch content-type guessing. Tests are free to use the `kubernetes` client on the same
kubeconfig. Every request has a timeout; the server is always on 127.0.0.1.
"""

from __future__ import annotations

import base64
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import requests
import yaml

Obj = dict[str, Any]
T = TypeVar("T")


class KubeError(RuntimeError):
    """An apiserver answer other than success; `status` is the HTTP status code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Kube:
    """Talks JSON to the apiserver named in an admin kubeconfig (client-certificate auth)."""

    def __init__(self, kubeconfig: Path | str, timeout: float = 10.0) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = cfg.get("current-context") or cfg["contexts"][0]["name"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server: str = cluster["server"].rstrip("/")
        self.timeout = timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="ftjob-kube-")
        self.session = requests.Session()
        self.session.verify = self._file(cluster, "certificate-authority")
        self.session.cert = (self._file(user, "client-certificate"), self._file(user, "client-key"))
        self.session.trust_env = False  # never route loopback traffic through a proxy

    def _file(self, section: Obj, key: str) -> str:
        if key in section:
            return str(section[key])
        path = Path(self._tmp.name) / key
        path.write_bytes(base64.b64decode(section[f"{key}-data"]))
        return str(path)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Obj:
        """One request; `headers` adds e.g. `Impersonate-User` (the admin may impersonate)."""
        resp = self.session.request(
            method,
            self.server + path,
            json=body,
            params=params,
            headers={"Content-Type": content_type, "Accept": "application/json", **(headers or {})},
            timeout=timeout or self.timeout,
        )
        if resp.status_code >= 400:
            try:
                message = resp.json().get("message", resp.text)
            except ValueError:
                message = resp.text
            raise KubeError(resp.status_code, message)
        if not resp.content:
            return {}
        result: Obj = resp.json()
        return result

    def get(self, path: str, **params: Any) -> Obj:
        return self.request("GET", path, params=params or None)

    def get_or_none(self, path: str) -> Obj | None:
        try:
            return self.get(path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def items(self, path: str, **params: Any) -> list[Obj]:
        items: list[Obj] = self.get(path, **params).get("items", [])
        return items

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Obj) -> Obj:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: Obj | None = None) -> Obj:
        return self.request("DELETE", path, body)

    def close(self) -> None:
        self.session.close()
        self._tmp.cleanup()


WAIT_SCALE_ENV = "FTJOB_TEST_TIMEOUT_SCALE"
"""A multiplier for the bounds of the tests' waits and timeouts (default 1). `scripts/test.sh`
sets it while its lanes share the machine: a bound guards against a hang, it does not measure
speed, and at load 16 on 2 cores a process gets a tenth of a core."""


def wait_scale() -> float:
    """FTJOB_TEST_TIMEOUT_SCALE as a number, at least 1 (1 when unset or unreadable)."""
    try:
        return max(1.0, float(os.environ.get(WAIT_SCALE_ENV, "1")))
    except ValueError:
        return 1.0


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll `check` until it returns something other than None/False; bounded by `timeout`
    (times `wait_scale()`).

    Returns that value, or raises TimeoutError naming `what` and the last exception seen.
    """
    timeout *= wait_scale()
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            value = check()
            if value is not None and value is not False:
                return value
        except (KubeError, requests.RequestException) as exc:
            last = f" (last error: {exc})"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{last}")
        time.sleep(interval)
