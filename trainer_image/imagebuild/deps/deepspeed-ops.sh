#!/bin/sh
# Prebuild DeepSpeed's cpu_adam and async_io ops (with pin_memory, which async_io loads) into a
# venv, for the CUDA accelerator, so that a GPU node never compiles anything.
#
#   sh deepspeed-ops.sh VENV
#
# DeepSpeed's own install path: its source release of the version already in VENV, reinstalled
# with DS_BUILD_CPU_ADAM=1 DS_BUILD_AIO=1 under DS_ACCELERATOR=cuda, so that its
# git_version_info_installed records both ops as installed for the accelerator ('cuda') that GPU
# nodes run, and OpBuilder.load imports them instead of building them. The three ops are host
# code (no .cu sources; async_io reaches the GPU only through torch's tensor API), so they need
# no CUDA toolkit: without one, DeepSpeed builds async_io as a C++ extension, as it does for a
# JIT build on a node that has no nvcc. Two adjustments, each checked below:
#   - portable-cc (beside this file) fixes the CPU level: DeepSpeed would compile for the build
#     machine's CPU (-march=native), which can be newer than a GPU node's.
#   - LDFLAGS links libaio: DeepSpeed's CUDA async_io builder links it only when it finds a CUDA
#     toolkit; without it the op would not import (undefined symbol io_submit). LDFLAGS come
#     before the objects, and Debian's gcc links --as-needed by default, which would drop a
#     library named before the objects that use it: hence --no-as-needed.
# Needs a C++ compiler, Python's headers, libaio-dev and binutils; the caller removes them.
set -eu
venv=$1
here=$(cd "$(dirname "$0")" && pwd)
machine=$(uname -m)
[ "$machine" = x86_64 ] || { echo "deepspeed-ops.sh: prebuilt ops are built for x86_64 only (this is $machine)" >&2; exit 1; }

version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("deepspeed"))')
wrappers=$(mktemp -d)
install -m 755 "$here/portable-cc" "$wrappers/portable-cc"
for name in cc c++ gcc g++ x86_64-linux-gnu-gcc x86_64-linux-gnu-g++; do ln -s portable-cc "$wrappers/$name"; done
echo "deepspeed-ops.sh: building cpu_adam, async_io and pin_memory of deepspeed $version for -march=${OPS_MARCH:-x86-64-v3}"
# The venv's bin for ninja (parallel compiles), ahead of it the compiler wrappers.
PATH="$wrappers:$venv/bin:$PATH" DS_ACCELERATOR=cuda DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_AIO=1 \
  DS_ENABLE_NINJA=1 MAX_JOBS="$(nproc)" LDFLAGS="-Wl,--no-as-needed -laio" \
  "$venv/bin/pip" install --no-deps --no-build-isolation --force-reinstall --no-binary deepspeed "deepspeed==$version"
rm -rf "$wrappers"

# DeepSpeed records the three ops as installed for 'cuda', and the torch they were built with.
DS_ACCELERATOR=cuda "$venv/bin/python" - <<'PY'
from deepspeed.git_version_info import accelerator_name, installed_ops, torch_info
built = sorted(name for name, on in installed_ops.items() if on)
assert accelerator_name == "cuda", accelerator_name
assert built == ["async_io", "cpu_adam", "pin_memory"], built
print("deepspeed-ops.sh: installed", built, "for", accelerator_name, "with torch", torch_info)
PY

# Found without importing deepspeed, which logs its accelerator to stdout.
ops=$("$venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("deepspeed").submodule_search_locations[0])')/ops
found=0
for so in "$ops"/adam/cpu_adam_op*.so "$ops"/aio/async_io_op*.so "$ops"/pin_memory/pin_memory_op*.so; do
  [ -f "$so" ] || { echo "deepspeed-ops.sh: missing $so" >&2; exit 1; }
  found=$((found + 1))
  # No AVX-512 instruction (zmm registers, opmask registers k1-k7): the ops run on any x86-64-v3 CPU.
  if [ "${OPS_MARCH:-x86-64-v3}" != x86-64-v4 ] && objdump -d --no-show-raw-insn "$so" | grep -qE '%zmm[0-9]|%k[1-7]'; then
    echo "deepspeed-ops.sh: $so contains AVX-512 instructions" >&2; exit 1
  fi
done
readelf -d "$ops"/aio/async_io_op*.so | grep -q 'NEEDED.*libaio\.so' \
  || { echo "deepspeed-ops.sh: async_io is not linked with libaio" >&2; exit 1; }
echo "deepspeed-ops.sh: $found ops built, no AVX-512 instructions, async_io linked with libaio"
