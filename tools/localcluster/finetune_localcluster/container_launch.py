"""Starting one container as a local process: `unshare --mount --uts` and a small shell that
sets the hostname, bind-mounts the pod's volumes, /etc/hosts and the termination-message file
at their paths (creating empty mount points on the host; parents before the paths below them,
each from a descriptor opened before the first mount, so no volume hides another's source),
and execs the command."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from finetune_localcluster.cluster import with_parent_death_signal
from finetune_localcluster.pod_contents import VENV_BIN, NotReadyYet, expand
from finetune_localcluster.pod_runs import Container, PodRun, now

FIRST_FD = 10
"""The shell's descriptors for the volumes' sources start here (bash keeps 0-9 for scripts)."""


def launch(run: PodRun, c: Container, env: dict[str, str]) -> None:
    """Start container `c` of `run` with `env`: its own mount and UTS namespace, the volumes,
    /etc/hosts and the termination-message file bind-mounted at their paths, then exec."""
    cmd = [expand(a, env) for a in c.spec.get("command") or []]
    argv = cmd + [expand(a, env) for a in c.spec.get("args") or []]
    if not argv:
        raise NotReadyYet(f"container {c.name} has no command or args (images are not run here)")
    if "/" not in argv[0]:
        argv[0] = shutil.which(argv[0], path=env["PATH"]) or argv[0]
    elif not os.path.exists(argv[0]) and (VENV_BIN / Path(argv[0]).name).exists():
        argv[0] = str(VENV_BIN / Path(argv[0]).name)
    cdir = run.dir / "containers" / c.name
    cdir.mkdir(parents=True, exist_ok=True)
    (cdir / "termination-log").write_bytes(b"")
    mounts = [
        (run.dir / "hosts", "/etc/hosts", False),
        (cdir / "termination-log", c.spec.get("terminationMessagePath") or "/dev/termination-log", False),
    ]
    for m in c.spec.get("volumeMounts", []):
        src = run.volumes[m["name"]] / m.get("subPath", "")
        if m.get("subPath"):
            src.parent.mkdir(parents=True, exist_ok=True)
            if not src.exists():
                src.mkdir()
        mounts.append((src, m["mountPath"], bool(m.get("readOnly"))))
    lines = ["set -e", f"hostname {shlex.quote(run.hostname[:63])}"]
    # Every source is opened before anything is mounted: a volume mounted over a directory that
    # holds another volume's source (an emptyDir at /tmp, where the claims and the pod's files
    # live) would hide it. The binds then go through the open descriptors, parents first.
    opened = [(FIRST_FD + i, src, dst, ro) for i, (src, dst, ro) in enumerate(mounts)]
    lines += [f"exec {fd}<{shlex.quote(str(src))}" for fd, src, _, _ in opened]
    for fd, src, dst, ro in sorted(opened, key=lambda m: len(Path(m[2]).parts)):
        q = shlex.quote(dst)
        lines.append(f"mkdir -p {q}" if src.is_dir() else f"mkdir -p $(dirname {q}); [ -e {q} ] || : > {q}")
        lines.append(f"mount --no-canonicalize --bind /proc/$$/fd/{fd} {q}")
        if ro:
            lines.append(f"mount -o remount,bind,ro {q}")
    lines += [f"exec {fd}<&-" for fd, _, _, _ in opened]
    workdir = c.spec.get("workingDir") or "/"
    lines += [f"mkdir -p {shlex.quote(workdir)}", f"cd {shlex.quote(workdir)}", 'exec "$@"']
    with open(run.dir / f"{c.name}.log", "ab") as log:
        # Where this run of the container starts in its log: a kubelet serves the current run's
        # log, and the previous run's with `previous=true` (kubelet_api.py reads these offsets).
        with open(run.dir / f"{c.name}.log.starts", "a") as starts:
            starts.write(f"{log.seek(0, os.SEEK_END)}\n")
        c.proc = subprocess.Popen(
            with_parent_death_signal(
                [
                    "unshare",
                    "--mount",
                    "--uts",
                    "--propagation",
                    "private",
                    "/bin/bash",
                    "-c",
                    "\n".join(lines),
                    "sh",
                    *argv,
                ]
            ),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=run.dir,
            start_new_session=True,
        )
    if "terminated" in c.state:
        c.last_state, c.restarts = c.state, c.restarts + 1
    c.started_at, c.started_mono, c.probe_at, c.env = now(), time.monotonic(), 0.0, env
    c.state = {"running": {"startedAt": c.started_at}}
    c.ready = False
