"""A pod's model download gets its own time limit, and the pods of a gang start their ranks together.

The ranks' rendezvous timeout (FTJOB_DIST_TIMEOUT_MINUTES, 30) is meant for ranks that are up
and talking. Without this, a pod that finished its download first would start its ranks, and
they would wait at the rendezvous for a slower pod still downloading 141 GB: a slow download
became a rendezvous timeout, and a gang restart. So:

- the download runs under `FTJOB_DOWNLOAD_TIMEOUT_SECONDS` (the operator renders it; 2 h by
  default): past it the pod fails with `ModelNotFound` naming the limit, and the gang restart
  resumes the download from the pod's cache claim (the partial files are kept);
- with more than one node, every pod waits after its download until all pods have theirs,
  before any starts its ranks (`gang_ready`): node 0 listens on the rendezvous port, which no
  rank holds yet; the others connect, say they are ready, and all are released together. The
  wait is bounded by the same limit: a peer that outlives it has failed, and the operator
  restarts the gang. Node 0 closes the port before its ranks bind it again.

Pure standard library: the entrypoint never imports torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from finetune_operator.api.pod_contract import TerminationReason
from finetune_operator.api.pod_env import PodEnv
from finetune_trainer.errors import TrainerError

log = logging.getLogger(__name__)

TIMEOUT_ENV = PodEnv.FTJOB_DOWNLOAD_TIMEOUT_SECONDS
DEFAULT_TIMEOUT_SECONDS = 7200.0
READY, GO = b"ready\n", b"go\n"
RETRY_SECONDS = 1.0

T = TypeVar("T")


class DownloadTimeout(TrainerError, RuntimeError):
    """The download, or the wait for the other pods' downloads, outlived its limit."""

    reason = TerminationReason.DOWNLOAD_TIMEOUT


def download_timeout() -> float:
    try:
        return max(1.0, float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_SECONDS)))
    except ValueError:
        return DEFAULT_TIMEOUT_SECONDS


def within_limit(download: Callable[[], T], limit: float, what: str) -> T:
    """`download()` if it returns within `limit` seconds; DownloadTimeout otherwise (it is left running
    in a daemon thread: the entrypoint exits right after)."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(download())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    worker = threading.Thread(target=run, name="model-download", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        raise DownloadTimeout(
            f"{what} took more than {limit:.0f} s ({TIMEOUT_ENV}); the restarted pod resumes it from its cache"
        )
    if error:
        raise error[0]
    return result[0]


def gang_ready(node_rank: int, nodes: int, master_addr: str, port: int, deadline: float) -> None:
    """Return once every node of the gang has finished its download (node 0 coordinates on `port`)."""
    if nodes <= 1:
        return
    if node_rank == 0:
        _release_all(nodes, port, deadline)
    else:
        _wait_for_release(node_rank, master_addr, port, deadline)


def _left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DownloadTimeout(f"{what} within {TIMEOUT_ENV}")
    return left


def _release_all(nodes: int, port: int, deadline: float) -> None:
    with socket.create_server(("", port), backlog=nodes) as server:
        peers: dict[int, socket.socket] = {}
        try:
            while len(peers) < nodes - 1:
                server.settimeout(_left(deadline, f"only {len(peers) + 1} of {nodes} pods finished their download"))
                try:
                    conn, _ = server.accept()
                    conn.settimeout(10.0)
                    rank = _hello(conn.recv(64))
                except OSError:  # a timeout: the deadline is checked again above
                    continue
                if rank is None or not 0 < rank < nodes:
                    conn.close()
                    continue
                if rank in peers:  # a node that reconnected: its newest connection counts
                    peers[rank].close()
                peers[rank] = conn
            log.warning("all %d pods have the model: starting the ranks", nodes)
            for conn in peers.values():
                conn.sendall(GO)
            for conn in peers.values():  # they close first: the rendezvous port is free to bind again at once
                conn.settimeout(max(1.0, min(30.0, deadline - time.monotonic())))
                with contextlib.suppress(OSError):
                    conn.recv(1)
        finally:
            for conn in peers.values():
                conn.close()


def _hello(data: bytes) -> int | None:
    word, _, rank = data.strip().partition(b" ")
    return int(rank) if word == READY.strip() and rank.isdigit() else None


def _wait_for_release(node_rank: int, master_addr: str, port: int, deadline: float) -> None:
    while True:
        left = _left(deadline, f"node {node_rank} waited for the other pods' downloads (node 0: {master_addr}:{port})")
        try:
            with socket.create_connection((master_addr, port), timeout=min(left, 10.0)) as conn:
                conn.sendall(READY.strip() + f" {node_rank}\n".encode())
                conn.settimeout(_left(deadline, f"node {node_rank} waited for the other pods' downloads"))
                if conn.recv(len(GO)) == GO:
                    return
        except OSError:  # node 0 not listening yet (still downloading), or restarted
            pass
        time.sleep(min(RETRY_SECONDS, max(0.0, deadline - time.monotonic())))
