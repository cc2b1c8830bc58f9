"""Check, inside the built trainer image, what a GPU node needs that the build must provide.

scripts/build-images.sh runs this in the image as its non-root user, with DS_ACCELERATOR=cuda
(what the operator sets on GPU pods) on a machine without a GPU:

- no compiler (nor nvcc) is in the image, so nothing can be compiled at run time;
- `ds_report` lists cpu_adam and async_io as installed for the CUDA accelerator;
- DeepSpeed's op builders load cpu_adam and async_io without a just-in-time build (nothing is
  written to TORCH_EXTENSIONS_DIR), and both ops run: one CPU Adam step, and a tensor written
  to a file and read back through libaio;
- libibverbs.so.1 loads and lists devices, and the verbs providers NCCL uses for InfiniBand,
  RoCE (mlx5) and EFA are installed with their driver files;
- NCCL's own library (torch's nvidia-nccl) is present and reports its version.

Each passing check prints one `check ok: ...` line; the first failure exits non-zero with a
message that names what is missing.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

LIB_DIR = "/usr/lib/x86_64-linux-gnu"


def ok(message: str) -> None:
    print(f"check ok: {message}", flush=True)


def fail(message: str) -> None:
    sys.exit(f"check failed: {message}")


def check_no_compiler() -> None:
    found = [tool for tool in ("cc", "c++", "gcc", "g++", "clang", "nvcc") if shutil.which(tool)]
    if found:
        fail(f"compilers in the image: {found}")
    ok("no compiler and no nvcc on PATH")


def check_ds_report() -> None:
    result = subprocess.run(["ds_report"], capture_output=True, text=True, check=False, timeout=300)
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    if result.returncode != 0:
        fail(f"ds_report exited {result.returncode}: {result.stderr[-2000:]}")
    installed = dict(re.findall(r"^(\w+) \.+ \[(YES|NO)\] \.+", text, flags=re.MULTILINE))
    missing = [op for op in ("cpu_adam", "async_io") if installed.get(op) != "YES"]
    if missing:
        fail(f"ds_report does not list {missing} as installed:\n{text}")
    ok("ds_report lists cpu_adam and async_io as installed")


def check_ops_load_prebuilt() -> None:
    import torch
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator._name != "cuda":
        fail(f"DeepSpeed's accelerator is {accelerator._name!r}, expected 'cuda' (DS_ACCELERATOR=cuda)")
    extensions = os.environ["TORCH_EXTENSIONS_DIR"]
    cpu_adam = accelerator.create_op_builder("CPUAdamBuilder").load()
    async_io = accelerator.create_op_builder("AsyncIOBuilder").load()
    for module in (cpu_adam, async_io):
        if "site-packages/deepspeed/ops/" not in str(module.__file__):
            fail(f"{module.__name__} was loaded from {module.__file__}, not from the prebuilt ops")
    if os.path.exists(extensions) and os.listdir(extensions):
        fail(f"a just-in-time build wrote {os.listdir(extensions)} to {extensions}")
    ok(f"cpu_adam and async_io load prebuilt ({cpu_adam.__file__}, {async_io.__file__}), nothing built")

    from deepspeed.ops.adam import DeepSpeedCPUAdam

    weight = torch.nn.Parameter(torch.ones(64))
    weight.grad = torch.full((64,), 0.5)
    DeepSpeedCPUAdam([weight], lr=0.1).step()
    if not torch.allclose(weight.detach(), torch.full((64,), 0.9), atol=1e-3):
        fail(f"one CPU Adam step from 1.0 with lr 0.1 gave {weight.detach()[:4].tolist()}, expected 0.9")
    ok("one DeepSpeedCPUAdam step updates the weights as Adam does")

    handle = async_io.aio_handle(block_size=1024 * 1024, queue_depth=8)
    # O_DIRECT needs page-aligned buffers, which DeepSpeed's NVMe swapper takes from the handle;
    # a plain tensor is written as nothing (checked: 0 bytes, no error).
    like = torch.empty(0, dtype=torch.float32)
    written = handle.new_cpu_locked_tensor(4096, like).copy_(torch.arange(4096, dtype=torch.float32))
    read = handle.new_cpu_locked_tensor(4096, like).zero_()
    with tempfile.TemporaryDirectory(dir=os.environ.get("HOME")) as directory:
        path = os.path.join(directory, "tensor.bin")
        handle.write(written, path, False)
        handle.read(read, path, False)
    if not torch.equal(written, read):
        fail("a tensor written and read back through async_io differs")
    ok("async_io writes a tensor to a file and reads it back (libaio)")
    if os.path.exists(extensions) and os.listdir(extensions):
        fail(f"running the ops built {os.listdir(extensions)} in {extensions}")


def check_rdma() -> None:
    verbs = ctypes.CDLL("libibverbs.so.1")
    verbs.ibv_get_device_list.restype = ctypes.c_void_p
    count = ctypes.c_int(-1)
    devices = verbs.ibv_get_device_list(ctypes.byref(count))
    if devices:
        verbs.ibv_free_device_list(ctypes.c_void_p(devices))
    ok(f"libibverbs.so.1 loads; ibv_get_device_list sees {count.value} device(s) here")
    for provider in ("mlx5", "efa"):
        libraries = glob.glob(f"{LIB_DIR}/libibverbs/lib{provider}-rdmav*.so")
        driver = f"/etc/libibverbs.d/{provider}.driver"
        if not libraries or not os.path.exists(driver):
            fail(f"the {provider} verbs provider is missing (libibverbs/lib{provider}-rdmav*.so, {driver})")
        ctypes.CDLL(libraries[0])
    ok("verbs providers mlx5 (InfiniBand, RoCE) and efa are installed and load")


def check_nccl() -> None:
    import nvidia.nccl

    paths = [os.path.join(path, "lib", "libnccl.so.2") for path in nvidia.nccl.__path__]
    present = [path for path in paths if os.path.exists(path)]
    if not present:
        fail(f"NCCL's library is missing (looked for {paths})")
    nccl = ctypes.CDLL(present[0])
    version = ctypes.c_int(0)
    if nccl.ncclGetVersion(ctypes.byref(version)) != 0:
        fail("ncclGetVersion failed")
    plugins = glob.glob(f"{LIB_DIR}/libnccl-net*.so") + glob.glob("/opt/ftjob/lib/libnccl-net*.so")
    ok(f"NCCL {version.value} at {present[0]}; net plugins: {plugins or 'none (built-in IB and socket transports)'}")


def main() -> None:
    if os.environ.get("DS_ACCELERATOR") != "cuda":
        fail("run with DS_ACCELERATOR=cuda, as GPU pods are")
    if os.getuid() == 0:
        fail("run as the image's non-root user")
    check_no_compiler()
    check_ds_report()
    check_ops_load_prebuilt()
    check_rdma()
    check_nccl()


if __name__ == "__main__":
    main()
