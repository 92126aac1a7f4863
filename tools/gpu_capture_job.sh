#!/usr/bin/env bash
# The one GPU job of fpsim's tensor-core capture: run from the repository root
#   bash tools/gpu_capture_job.sh "$OUT" [extra `fpsim capture` options]
# It prints the machine's facts, runs `fpsim capture` from this checkout, and
# leaves in $OUT: h200.npz (the capture; h200-library.npz too if it had to be
# split), capture.log (everything printed), mma.sass / wgmma.sass (the kernels'
# SASS), and ends with `fpsim validate` of the capture against the model. A
# failing case is recorded in the capture's meta["failures"] and the log; the
# other cases go on. Bounded to about 5 minutes.
set -u
OUT="${1:?usage: bash tools/gpu_capture_job.sh OUT_DIR [fpsim capture options]}"
shift
mkdir -p "$OUT"
LOG="$OUT/capture.log"
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

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

# The capture is a client of the package: fpsim must import here (numpy, ml_dtypes, torch).
if ! python3 -c "import fpsim.tensorcore.gpu_capture" >>"$LOG" 2>&1; then
  echo "== importing fpsim failed (traceback in $LOG): nothing captured" | tee -a "$LOG"
  exit 3
fi

echo "== capture: python3 -m fpsim capture --out $OUT/h200.npz $*" | tee -a "$LOG"
timeout -k 10 290 python3 -m fpsim capture --out "$OUT/h200.npz" --log "$LOG" --sass-dir "$OUT" "$@"
rc=$?
echo "== capture exited with $rc" | tee -a "$LOG"

# The capture read back through the schema's checks and compared with the model (no GPU needed).
for file in "$OUT"/h200*.npz; do
  [ -e "$file" ] && timeout 120 python3 -m fpsim validate "$file" 2>&1 | tee -a "$LOG"
done
ls -la "$OUT" | tee -a "$LOG"
exit $rc
