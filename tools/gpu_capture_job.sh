#!/usr/bin/env bash
# The one GPU job of fpsim's tensor-core capture: run from the repository root
#   bash tools/gpu_capture_job.sh "$OUT" [extra gpu_capture options]
# It prints the machine's facts, runs fpsim.tensorcore.gpu_capture, and leaves
# in $OUT: h200.npz (the capture; h200-library.npz too if it had to be split),
# capture.log (everything printed), mma.sass / wgmma.sass (the kernels' SASS).
# A failing case is recorded in the capture's meta["failures"] and the log; the
# other cases go on. Bounded to about 5 minutes.
set -u
OUT="${1:?usage: bash tools/gpu_capture_job.sh OUT_DIR [gpu_capture options]}"
shift
mkdir -p "$OUT"
LOG="$OUT/capture.log"
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# Runs gpu_capture without executing fpsim/__init__.py (in case other fpsim
# modules need builds this machine does not have).
BOOT='import os, sys, types, runpy
root = sys.argv.pop(1)
for name, sub in (("fpsim", ("fpsim",)), ("fpsim.tensorcore", ("fpsim", "tensorcore"))):
    if name not in sys.modules:
        m = types.ModuleType(name); m.__path__ = [os.path.join(root, *sub)]
        sys.modules[name] = m
mod = sys.argv.pop(1)
runpy.run_module(mod, run_name="__main__", alter_sys=True)'

{
  echo "== fpsim GPU capture job, $(date -u +%Y-%m-%dT%H:%M:%SZ), in $PWD"
  nvidia-smi || echo "nvidia-smi failed"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.mem --format=csv || true
  nvcc --version || echo "nvcc not found"
  command -v cuobjdump || echo "cuobjdump not found"
  python3 - <<'PY'
import importlib, platform
print("python", platform.python_version())
for name in ("numpy", "ml_dtypes", "torch", "cupy", "triton"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(name, "not importable:", e)
try:
    import torch
    print("torch.version.cuda", torch.version.cuda, "| cuda available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("device", torch.cuda.get_device_name(0), "cc", torch.cuda.get_device_capability(0))
except Exception as e:  # noqa: BLE001
    print("torch check failed:", e)
PY
} 2>&1 | tee -a "$LOG"

if python3 -c "import fpsim.tensorcore.gpu_capture" >>"$LOG" 2>&1; then
  RUN=(python3 -m fpsim.tensorcore.gpu_capture)
else
  echo "importing fpsim failed (see the log): running gpu_capture without fpsim/__init__.py" | tee -a "$LOG"
  RUN=(python3 -c "$BOOT" "$PWD" fpsim.tensorcore.gpu_capture)
fi

echo "== capture: ${RUN[*]} --out $OUT/h200.npz $*" | tee -a "$LOG"
timeout -k 10 290 "${RUN[@]}" --out "$OUT/h200.npz" --log "$LOG" --sass-dir "$OUT" "$@"
rc=$?
echo "== capture exited with $rc" | tee -a "$LOG"

# Summary of what was written (read back through the schema's own checks).
python3 -c "$BOOT" "$PWD" fpsim.tensorcore.captures "$OUT"/h200*.npz 2>&1 | tee -a "$LOG"
ls -la "$OUT" | tee -a "$LOG"
exit $rc
