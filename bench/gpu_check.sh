#!/usr/bin/env bash
# One-shot GPU check (H200 session, no internet): build, CUDA tests, every benchmark with
# CUDA sizes, JSON under $OUT (flat, <= 8 files), a short table last.
# Every step has its own time limit inside an overall budget (BUDGET_S, default 540 s);
# a failing step is logged and the script goes on. Usage: OUT=/some/dir bash bench/gpu_check.sh
# (ONLY="install bench-sweep" runs the named steps alone.)
set -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
# Results go to $OUT/r and are packed into $OUT/results.tgz at the end (the device tool returns
# at most 8 files); the log stays beside it.
R="$OUT/r"
mkdir -p "$R"
BUDGET_S="${BUDGET_S:-540}"
START=$(date +%s)
PY="${PYTHON:-python3}"
export TRITON_INTERPRET=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export CUDAARCHS="${CUDAARCHS:-90}"  # build for the card in hand only: half the nvcc time
STATUS=()

step() {  # step NAME LIMIT_S CMD...: run with min(LIMIT_S, time left), record the outcome
  local name="$1" limit="$2"; shift 2
  # ONLY="install bench-sweep ...": a rerun of the named steps alone (what failed last time)
  if [[ -n "${ONLY:-}" && " $ONLY " != *" $name "* ]]; then return; fi
  local left=$(( BUDGET_S - ($(date +%s) - START) ))
  if (( left < 20 )); then echo "== $name: SKIPPED (budget spent)"; STATUS+=("$name: skipped (budget)"); return; fi
  (( limit > left )) && limit=$left
  echo "== $name (limit ${limit}s): $*"
  local t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@"
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if (( rc == 0 )); then STATUS+=("$name: ok (${dt}s)")
  elif (( rc == 5 )) && [[ "$name" == pytest* ]]; then STATUS+=("$name: no tests collected")
  elif (( rc == 124 || rc == 137 )); then STATUS+=("$name: TIMEOUT after ${dt}s")
  else STATUS+=("$name: FAILED rc=$rc (${dt}s)"); fi
  echo "== $name: rc=$rc, ${dt}s"
}

echo "== machine"; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
nproc; uptime
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" || true
$PY -c "import triton; print('triton', triton.__version__)" || true
nvcc --version | tail -2 || true

if [ -z "${SKIP_INSTALL:-}" ]; then
  step install 180 $PY -m pip install --no-build-isolation --no-deps --no-index -e . -q
  # Without the compiled extension the package still imports from the tree (torch / scipy paths).
  $PY -c "import lmc_fast" 2>/dev/null || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
$PY -c "import lmc_fast.kernels as K; print('extension:', K.build_info())" || true

# In priority order: ceilings, correctness, then the issue's targets, then the rest.
step ceilings 40 $PY bench/gpu_ceilings.py --out "$R"
step pytest-kernels 120 $PY -m pytest -p no:cacheprovider -q -n 8 tests/kernels --junitxml="$R/pytest_kernels.xml"
step bench-sweep 120 $PY bench/bench_sweep.py --device cuda --images 512 --seqs 64 --repeat 5 --out "$R"
step bench-polar 45 $PY bench/bench_polar.py --device cuda --quick --out "$R"
step bench-learned 60 $PY bench/bench_learned.py --device cuda --steps 20 --batch 128 --lambdas 4 --out "$R"
step llama-1.1b-wm 100 $PY bench/bench_llama_scale.py --device cuda --preset 1.1b --max-iter 3 --out "$R"
step bench-assignment 60 $PY bench/bench_assignment.py --device cuda --out "$R"
step pytest-gpu 90 $PY -m pytest -p no:cacheprovider -q -n 4 -m gpu tests --ignore=tests/kernels --junitxml="$R/pytest_gpu.xml"
step gpu-profile 75 $PY bench/gpu_profile.py --out "$R"
step bench-lerp-matmul 60 $PY bench/bench_lerp_matmul.py --device cuda --out "$R"
step bench-weight-matching 60 $PY bench/bench_weight_matching.py --device cuda --max-iter 3 --out "$R"

echo
echo "== steps ($(( $(date +%s) - START ))s in all)"
for s in "${STATUS[@]}"; do echo "  $s"; done
echo "== results"
$PY - "$R" <<'PYEOF' || true
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
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
ls -la "$OUT"
sleep 1  # let tee flush
