"""Work a few ranks do while the others wait, outside the collective timeout.

Some work is done by rank 0 (or by one rank per pod) alone: converting a checkpoint to a
universal one, writing the trained model and the merged export, uploading to object storage.
The other ranks used to wait for it in an all-reduce or a barrier, and a collective has the
process group's timeout (FTJOB_DIST_TIMEOUT_MINUTES, 30 by default): past it NCCL's watchdog
aborts the waiting ranks (gloo raises), the gang restarts, and a conversion that takes longer
than the timeout (a ~30B model's) starts again on every restart, forever.

So the waiting ranks poll the process group's key-value store (the TCPStore every rank already
reached at the rendezvous) and have no collective in flight. Each rank doing the work beats a
heartbeat counter there from a thread; a waiter gives up only when the counter stands still for
FTJOB_LEADER_SILENCE_SECONDS (600 by default: the worker hangs), or when the store itself is
gone (it lives in rank 0's process, so rank 0's death ends the wait at once). Every rank calls
`run` in the same order, as it would a collective; a single process, or one without a process
group, just does its part.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SILENCE_ENV = "FTJOB_LEADER_SILENCE_SECONDS"
DEFAULT_SILENCE_S = 600.0
BEAT_S = 5.0
POLL_S = (0.05, 1.0)
"""The waiters' first and longest poll interval (it doubles in between)."""
KEY_PREFIX = "ftjob/leader-work"

_calls = itertools.count()


class LeaderWorkFailed(RuntimeError):
    """The ranks doing the work failed or went silent; the waiting ones say so instead of hanging."""


def _store() -> Any:
    """The default process group's store, or None (no process group, or a world of one)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def silence_limit() -> float:
    raw = os.environ.get(SILENCE_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_SILENCE_S
    except ValueError:
        message = f"{SILENCE_ENV}={raw!r}: must be a number of seconds (default {DEFAULT_SILENCE_S:.0f})"
        raise ValueError(message) from None


def run(work: Callable[[], None], *, doer: bool, doers: int, what: str) -> None:
    """Ranks with `doer` run `work` (`doers` of them in all); every rank returns once all of them
    have finished. An exception in `work` propagates on its rank, and the others raise
    `LeaderWorkFailed` naming `what`."""
    store = _store()
    if store is None:
        if doer:
            work()
        return
    key = f"{KEY_PREFIX}/{next(_calls)}"
    if doer:
        _do(store, key, work)
    try:
        _wait(store, key, doers, what)
    except (RuntimeError, OSError) as exc:  # DistNetworkError, DistStoreError: the store's host is gone
        if isinstance(exc, LeaderWorkFailed):
            raise
        raise LeaderWorkFailed(f"{what}: Connection closed by peer: rank 0's store is gone ({exc})") from None
    import torch.distributed as dist

    # every rank has seen the work done before any goes on: rank 0, which hosts the store, must
    # not end its process while another still polls it (a short wait, within any timeout)
    dist.barrier()


def _do(store: Any, key: str, work: Callable[[], None]) -> None:
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(BEAT_S):
            try:
                store.add(f"{key}/beat", 1)
            except Exception:  # the store is gone: the waiters learn it themselves
                return

    beating = threading.Thread(target=beat, name="leader-work-heartbeat", daemon=True)
    beating.start()
    failed = True
    try:
        work()
        failed = False
    finally:
        stop.set()
        beating.join()
        if failed:
            store.add(f"{key}/failed", 1)
        store.add(f"{key}/done", 1)


def _wait(store: Any, key: str, doers: int, what: str) -> None:
    limit = silence_limit()
    last, since, poll = -1, time.monotonic(), POLL_S[0]
    while int(store.add(f"{key}/done", 0)) < doers:
        beat = int(store.add(f"{key}/beat", 0))
        if beat != last:
            last, since = beat, time.monotonic()
        elif time.monotonic() - since > limit:
            raise LeaderWorkFailed(
                f"{what}: no heartbeat from the ranks doing it for {limit:.0f} s ({SILENCE_ENV}); "
                "see their log for where they hang"
            )
        time.sleep(poll)
        poll = min(POLL_S[1], poll * 2)
    if int(store.add(f"{key}/failed", 0)):
        raise LeaderWorkFailed(f"{what}: failed on another rank (see its log)")
