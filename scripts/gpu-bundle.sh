#!/usr/bin/env bash
# Packs what a bare GPU host (Python 3.12 with torch, transformers and numpy, nothing of ours)
# needs to run benchmarks/gpu_acceptance.py, into .gpu-bundle/ (git-ignored). The packages come
# from this checkout's venv, which scripts/bootstrap.sh syncs to uv.lock; the host's own torch
# (and its CUDA line) is the one thing not locked, and run.sh prints it beside the locked one:
#   site.tgz   the pure-Python packages at this checkout's locked versions (DeepSpeed, peft,
#              transformers, bitsandbytes with its CUDA 13 libraries only, pydantic, ...)
#   *.whl      cp312 wheels of the compiled ones (pydantic-core, regex, kernels)
#   run.sh     unpacks both into /tmp/site and runs the acceptance (and DeepSpeed's CPU Adam
#              JIT build), logging to ${OUT:-.}/acceptance.log
# Build it here (`bash scripts/gpu-bundle.sh`), copy the checkout with .gpu-bundle/ to the GPU
# host, and run `bash .gpu-bundle/run.sh` from the checkout's root there. About 27 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
SP=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
OUTDIR=.gpu-bundle
PURE=(deepspeed hjson pydantic annotated_types typing_inspection bitsandbytes transformers huggingface_hub
  httpx2 httpcore2 truststore peft tomlkit typing_extensions)
COMPILED=(pydantic_core regex kernels)
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR"
entries=()
for name in "${PURE[@]}"; do
  for path in "$SP/$name" "$SP/$name.py" "$SP/$name"-*.dist-info; do
    [[ -e $path ]] && entries+=("${path#"$SP"/}")
  done
done
tar -C "$SP" --exclude=__pycache__ --exclude='libbitsandbytes_cuda1[12]*' --exclude='libbitsandbytes_rocm*' \
  --exclude='libbitsandbytes_xpu*' -czf "$OUTDIR/site.tgz" "${entries[@]}"
pins=()
for name in "${COMPILED[@]}"; do
  pins+=("$name==$($PY -c "import importlib.metadata as m; print(m.version('$name'))")")
done
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$OUTDIR" "${pins[@]}"
$PY -c "import importlib.metadata as m; print(' | '.join(f'{p} {m.version(p)}' for p in ('torch', 'deepspeed', 'transformers', 'peft', 'bitsandbytes')))" >"$OUTDIR/locked.txt"
cat >"$OUTDIR/run.sh" <<'RUN'
#!/usr/bin/env bash
# Run from the checkout's root on the GPU host; BUDGET (seconds, default 360) goes to --budget-seconds.
set -o pipefail
T0=$(date +%s)
mkdir -p /tmp/site && tar -C /tmp/site -xzf .gpu-bundle/site.tgz || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu-bundle/*.whl || exit 4
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, importlib.metadata as m; print(sys.version.split()[0], *[f'{p} {m.version(p)}' for p in ('torch','deepspeed','transformers','peft','bitsandbytes')], sep=' | ')"
  echo "locked: $(cat .gpu-bundle/locked.txt)"
  echo "== acceptance"
  timeout 430 python3 benchmarks/gpu_acceptance.py --budget-seconds "${BUDGET:-360}" --work-dir /tmp
  echo "acceptance rc=$?"
  echo "== DeepSpeed CPU Adam JIT build, $(( $(date +%s) - T0 ))s in"
  timeout 80 python3 -c "
import time, torch; t = time.time()
from deepspeed.ops.adam import DeepSpeedCPUAdam
p = [torch.nn.Parameter(torch.randn(1000))]; o = DeepSpeedCPUAdam(p, lr=1e-3)
p[0].grad = torch.randn(1000); o.step(); print('cpu adam built and stepped in', round(time.time() - t, 1), 's')"
  echo "cpu adam rc=$?; total $(( $(date +%s) - T0 ))s"
} 2>&1 | grep --line-buffered -v "Loading weights\|Writing model shards" | tee "${OUT:-.}/acceptance.log"
RUN
du -sh "$OUTDIR"
