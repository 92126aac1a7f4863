#!/usr/bin/env bash
# Issue 17's GPU run, prepared to be the one command of a lent H200 (about 8 minutes):
#   bash tools/gpu_session.sh "$OUT"
# in the issue's order: the engine and the analyzer on CUDA (tools/gpu_checks.py, which also times
# quantize and quantize(compile=True) on 100M values), the analyzer's cost on a 12-layer 768-wide GPT
# under bf16 and fp16 autocast (tools/gpu_analyzer_overhead.py), the compiled engine against torch's
# round trip (benchmarks/bench_compiled.py) and the tensor-core model's speed on a 4096^3 product
# (benchmarks/bench_tensorcore.py). Each step is bounded by `timeout`; a failing step is logged and
# the next one runs. Leaves in $OUT: session.log, gpu-checks.json, analyzer-gpt.json,
# bench-compiled.txt, bench-tensorcore.txt (at most 8 files, as the device tool brings back).
# Not prepared yet: the issue's steps 3 (emulation against a real bf16 run) and 4 (cuBLAS K = 8192).
set -u
OUT="${1:?usage: bash tools/gpu_session.sh OUT_DIR}"
mkdir -p "$OUT"
LOG="$OUT/session.log"
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run, log, go on
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" | tee -a "$LOG"
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  echo "== $name exited with ${PIPESTATUS[0]}" | tee -a "$LOG"
}

{
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv || echo "nvidia-smi failed"
  python3 -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'numpy', numpy.__version__)"
} 2>&1 | tee -a "$LOG"
# The C kernel, built in place (the numpy engine is the oracle side of gpu_checks; without a
# compiler fpsim still runs, slower, and says so)
step build 120 python3 setup.py -q build_ext --inplace
step gpu-checks 150 python3 tools/gpu_checks.py "$OUT/gpu-checks.json"
step analyzer-gpt 150 python3 tools/gpu_analyzer_overhead.py "$OUT/analyzer-gpt.json"
step bench-compiled 90 sh -c "python3 benchmarks/bench_compiled.py > '$OUT/bench-compiled.txt'"
step bench-tensorcore 120 sh -c "python3 benchmarks/bench_tensorcore.py --n 4096 --formats bf16 --on cuda > '$OUT/bench-tensorcore.txt'"
ls -la "$OUT" | tee -a "$LOG"
