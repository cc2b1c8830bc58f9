"""Log records that tell a user nothing, dropped at the logger that emits them.

bitsandbytes' CPU backend, on a CPU with AVX512-BF16, tries to fetch a faster 4-bit GEMM
from the `kernels` package at import time (peft imports bitsandbytes, so every rank of a
plain fp32 LoRA run does this) and warns on every rank when `kernels` is not installed.
The fallback it uses instead is the ordinary path and nothing is wrong, so exactly that
message, with exactly that cause, is dropped; any other failure to load it still shows.
"""

from __future__ import annotations

import logging

BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
KERNELS_MISSING_PREFIX = "Failed to load CPU gemm_4bit_forward from kernels-community"


class _KernelsNotInstalled(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(KERNELS_MISSING_PREFIX):
            return True
        cause = record.args[0] if isinstance(record.args, tuple) and record.args else None
        return not (isinstance(cause, ModuleNotFoundError) and cause.name == "kernels")


def install() -> None:
    """Idempotent: call before anything imports bitsandbytes."""
    logger = logging.getLogger(BNB_CPU_LOGGER)
    if not any(isinstance(f, _KernelsNotInstalled) for f in logger.filters):
        logger.addFilter(_KernelsNotInstalled())
