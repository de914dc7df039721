#!/usr/bin/env bash
# One-shot GPU check (H200 session, no internet): build, CUDA tests, every benchmark with
# CUDA sizes, JSON under $OUT (flat, <= 8 files), a short table last.
# Every step has its own time limit inside an overall budget (BUDGET_S, default 540 s);
# a failing step is logged and the script goes on. Usage: OUT=/some/dir bash bench/gpu_check.sh
set -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
BUDGET_S="${BUDGET_S:-560}"
START=$(date +%s)
PY="${PYTHON:-python}"
export TRITON_INTERPRET=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
STATUS=()

step() {  # step NAME LIMIT_S CMD...: run with min(LIMIT_S, time left), record the outcome
  local name="$1" limit="$2"; shift 2
  local left=$(( BUDGET_S - ($(date +%s) - START) ))
  if (( left < 20 )); then echo "== $name: SKIPPED (budget spent)"; STATUS+=("$name: skipped (budget)"); return; fi
  (( limit > left )) && limit=$left
  echo "== $name (limit ${limit}s): $*"
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if (( rc == 0 )); then STATUS+=("$name: ok (${dt}s)")
  elif (( rc == 5 )) && [[ "$name" == pytest* ]]; then STATUS+=("$name: no tests collected")
  elif (( rc == 124 || rc == 137 )); then STATUS+=("$name: TIMEOUT after ${dt}s")
  else STATUS+=("$name: FAILED rc=$rc (${dt}s)"); fi
  echo "== $name: rc=$rc, ${dt}s"
}

echo "== machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" || true
$PY -c "import triton; print('triton', triton.__version__)" || true

if [ -z "${SKIP_INSTALL:-}" ]; then step install 240 $PY -m pip install --no-build-isolation -e . -q; fi
$PY -c "import lmc_fast.kernels as K; print('extension:', K.build_info())" || true

# tests/kernels in full (the Triton tests run compiled on CUDA, gpu-marked ones included),
# then the gpu-marked tests elsewhere
step pytest-kernels 150 $PY -m pytest -p no:cacheprovider -q tests/kernels --junitxml="$OUT/pytest_kernels.xml"
step pytest-gpu 60 $PY -m pytest -p no:cacheprovider -q -m gpu tests --ignore=tests/kernels

step bench-lerp-matmul 60 $PY bench/bench_lerp_matmul.py --device cuda --out "$OUT"
step bench-sweep 150 $PY bench/bench_sweep.py --device cuda --images 512 --seqs 64 --repeat 5 --out "$OUT"
step bench-polar 45 $PY bench/bench_polar.py --device cuda --quick
[ -f bench/results/polar_gpu.json ] && cp bench/results/polar_gpu.json "$OUT/"
step bench-weight-matching 120 $PY bench/bench_weight_matching.py --device cuda --max-iter 3 --out "$OUT"
step bench-learned 60 $PY bench/bench_learned.py --device cuda --steps 20 --batch 128 --lambdas 4
[ -f bench/results/learned_gpu.json ] && cp bench/results/learned_gpu.json "$OUT/"

echo
echo "== steps ($(( $(date +%s) - START ))s in all)"
for s in "${STATUS[@]}"; do echo "  $s"; done
echo "== results"
$PY - "$OUT" <<'PYEOF' || true
import json, sys
from pathlib import Path
rows = []
for f in sorted(Path(sys.argv[1]).glob("*.json")):
    try:
        recs = json.loads(f.read_text())
    except Exception as e:  # noqa: BLE001
        print(f"  {f.name}: unreadable ({e})"); continue
    for r in recs if isinstance(recs, list) else [recs]:
        extra = r.get("fraction_of_peak")
        rows.append((r.get("name", "?"), r.get("dtype", "?"), r.get("baseline_s"), r.get("ours_s"), r.get("speedup"),
                     "" if extra is None else f"{extra:.0%} of peak"))
print(f"{'name':<32} {'dtype':<9} {'base_s':>9} {'ours_s':>9} {'speedup':>8}  note")
for n, d, b, o, s, e in rows:
    f = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
    print(f"{n:<32} {d:<9} {f(b):>9} {f(o):>9} {f(s):>8}  {e}")
PYEOF
sleep 1  # let tee flush
