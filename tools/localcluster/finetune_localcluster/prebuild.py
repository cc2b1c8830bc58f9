"""Build, before any test starts, what the cluster and trainer tiers otherwise build on first use.

Why: on a cold machine the first test that needs Kueue, the S3 server (SeaweedFS, ~15 min of Go
on 2 cores) or MLflow's server venv builds it inside its own setup, under the test's timeout.
Under `scripts/test.sh`'s parallel lanes, a trainer test met the SeaweedFS build behind the
cluster tier's Kueue build and ran past its 600 s limit. `python -m finetune_localcluster
prebuild` (which test.sh runs before its lanes) does that work once, outside every timeout; when
everything is cached it returns at once. The MLflow install (network and unpacking) runs beside
the Go build (CPU).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from finetune_localcluster.binaries import ensure_binaries
from finetune_localcluster.mlflow_server import server_venv


def prebuild(
    *,
    build_binaries: Callable[[], object] = lambda: ensure_binaries(kueue=True, s3=True),
    install_mlflow: Callable[[], object] = server_venv,
    say: Callable[[str], None] = print,
) -> list[str]:
    """Run both builds, the MLflow install in a thread; once both have ended, the names of those
    that failed (each failure already said in one line, with its reason: the build script has
    printed its log's tail and name)."""
    failures: list[str] = []

    def timed(name: str, work: Callable[[], object]) -> None:
        started = time.monotonic()
        try:
            work()
        except Exception as exc:  # one line, not a traceback: the caller exits non-zero
            failures.append(name)
            say(f"[prebuild] {name}: FAILED ({exc})")
            return
        say(f"[prebuild] {name}: ready in {time.monotonic() - started:.0f}s")

    mlflow = threading.Thread(target=timed, args=("MLflow server venv", install_mlflow), daemon=True)
    mlflow.start()
    timed("Kubernetes, Kueue and SeaweedFS binaries", build_binaries)
    mlflow.join()
    return failures
