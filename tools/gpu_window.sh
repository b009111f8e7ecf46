#!/usr/bin/env bash
# A short GPU window spent on finishing cells, in one command (docs/gpu.md has the whole procedure).
#
#   OUT=<folder> BUDGET_S=500 [K=1] [CARRY=<pack folder>] [COST=skeinformer] [WHEELS=<site folder>] \
#     bash tools/gpu_window.sh grid=skeinformer_table1 task=listops seed=0 [overrides]
#
# Everything below counts against BUDGET_S, from this script's start:
# 1. CARRY: the pack an earlier window left (carry/<name>/, restored from git history as its README says), checked and
#    unpacked into the runs root (python -m lra.tools.carry unpack; a run already there is kept).
# 2. COST (default skeinformer; COST= skips it): the cost tables, measured at the micro-batches the CPU predicted
#    (python -m lra.tools.bench --cost skeinformer --plans results/cpu/fit/skeinformer_table4.csv), every row x
#    task, eager, under the V100 cap, a few steps each, at most COST_S seconds (default 270).
# 3. The sweep (python -m lra.tools.sweep <args> budget=<what is left> carry=true jobs_per_gpu=K): the data
#    first (generated with all of the node's cores, after the timings: beside them it would slow them), then the
#    grid's unfinished jobs, the soonest to finish first (a carried run from its own pace), K side by side on the GPU.
#    K=1 by default: the first window's five runs side by side made no more optimizer steps per second than one
#    run alone (docs/gpu.md). At the budget the runs still training get SIGTERM (interrupted record, last.ckpt).
# 4. What comes back, at most 8 files of at most 15 MiB (what a device window returns), under $OUT:
#    runs.tar.gz.partNN + runs.sha256   the unfinished runs (the next window's CARRY: python -m lra.tools.carry pack)
#    window.tar.gz                      results/ (the finished runs' small files), cost/ (the cost tables),
#                                       summary.txt (each run; the GPU's use, steps per second in all, GPU-minutes
#                                       per finished cell), gpu.csv (the GPU's use every 5 s), the logs, env.txt.
# Offline node without hydra: WHEELS=<folder from tools/offline_site.sh> joins PYTHONPATH.
set -u
t0=$(date +%s)
: "${OUT:?set OUT to the folder that receives what the window brings back}"
BUDGET_S=${BUDGET_S:-500}      # when the runs get SIGTERM, in seconds from the start of this script
K=${K:-1}                      # runs on the GPU at once
COST=${COST-skeinformer}       # the paper whose cost tables are measured first; empty: none
COST_S=${COST_S:-270}          # at most this long for them
PY=$(command -v python || command -v python3)
ROOT=$(pwd)
export PYTHONPATH="$ROOT${WHEELS:+:$WHEELS}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export LRA_RUNS=${LRA_RUNS:-$ROOT/runs}
mkdir -p "$OUT" "$LRA_RUNS"
W=$(mktemp -d)                 # this window's logs; $OUT receives only the bundle
log() { echo "[gpu_window $(( $(date +%s) - t0 ))s] $*" | tee -a "$W/window.log"; }
[ $# -gt 0 ] || { echo "gpu_window: give the sweep's arguments (grid=<name> [overrides])"; exit 2; }

{ date -u; hostname; pwd; "$PY" -V; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader;
  "$PY" -c "import torch, lightning, hydra, omegaconf; print('torch', torch.__version__, 'lightning', lightning.__version__, 'hydra', hydra.__version__, torch.cuda.get_device_name(0))"; } \
  > "$W/env.txt" 2>&1
cat "$W/env.txt"
"$PY" -c "import lra.train, lra.tools.sweep" || { log "the harness does not import: see env.txt"; exit 3; }
git rev-parse HEAD > "$W/commit.txt" 2>/dev/null || true
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$W/gpu.csv" 2>/dev/null &
smi=$!

if [ -n "${CARRY:-}" ]; then
  "$PY" -m lra.tools.carry unpack "$CARRY" --runs "$LRA_RUNS" 2>&1 | tee "$W/unpack.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { log "the pack in $CARRY was not unpacked (see above): stopping"; exit 4; }
fi

if [ -n "$COST" ]; then
  log "cost tables: $COST (at most $COST_S s)"
  "$PY" -m lra.tools.bench --cost "$COST" --plans "results/cpu/fit/${COST}_table4.csv" --budget-s "$COST_S" \
    --out "$W/cost" 2>&1 | tee "$W/cost.log"
  log "cost tables exited ${PIPESTATUS[0]}"
fi

left=$(( BUDGET_S - ($(date +%s) - t0) ))
s0=$(date +%s)
log "sweep: $* (budget ${left} s, $K per GPU)"
"$PY" -m lra.tools.sweep "$@" budget="$left" carry=true jobs_per_gpu="$K" parallel="$K" hydra/launcher=local \
  probe=false trainer.progress=false progress=60 2>&1 | tee "$W/sweep.log"
log "sweep exited ${PIPESTATUS[0]}"
s1=$(date +%s)
kill "$smi" 2>/dev/null

"$PY" - "$LRA_RUNS" "$W/gpu.csv" "$s0" "$s1" > "$W/summary.txt" <<'EOF'
# the runs this sweep wrote a record for; then its totals: optimizer steps per second in all, the GPU's use while
# it ran (nvidia-smi: the share of time a kernel ran), and GPU-minutes per cell it finished
import csv, datetime as dt, json, sys
from pathlib import Path
root, gpu_csv, s0, s1 = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
steps = finished = 0
for f in sorted(root.rglob("result.json")):
    if f.stat().st_mtime < s0:
        continue
    r = json.loads(f.read_text())
    here = int(r.get("steps") or 0) - int(r.get("resumed_from_step") or 0)
    steps += max(here, 0)
    finished += r.get("status") in ("completed", "stopped_early", "stuck")
    print(f"{str(f.parent.relative_to(root)):55s} {r.get('status'):13s} step {r.get('steps')} (+{here} here), "
          f"best val acc {r.get('best_val_acc')}, test acc {r.get('test_acc')}, {r.get('time_per_1k_steps_s')} s/1k "
          f"steps, micro-batch {r.get('micro_batch')} x {r.get('accum_steps')}, execution {r.get('execution')}")
use = []
try:
    for row in list(csv.reader(open(gpu_csv)))[1:]:
        if s0 <= dt.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp() <= s1:
            use.append(float(row[1].split()[0]))
except (OSError, ValueError, IndexError):
    pass
wall = s1 - s0
print(f"sweep: {wall:.0f} s, {steps} optimizer steps in all ({steps / max(wall, 1):.1f} per second), GPU busy "
      + (f"{sum(use) / len(use):.0f} % of the time" if use else "not read")
      + (f", {finished} finished: {wall / 60 / finished:.1f} GPU-minutes per finished cell" if finished else ", none finished"))
EOF
cat "$W/summary.txt"
"$PY" -m lra.tools.carry export "$LRA_RUNS" --to "$W/results" 2>&1 | tee "$W/export.log"
"$PY" -m lra.tools.carry pack "$LRA_RUNS" --out "$W/pack" 2>&1 | tee "$W/pack.log"
if [ -d "$W/pack" ]; then
  mv "$W/pack"/runs.tar.gz.part* "$W/pack/runs.sha256" "$OUT"/ && mv "$W/pack/pack.json" "$W"/
fi
log "done"
tar -czf "$OUT/window.tar.gz" -C "$W" --exclude pack .
ls -la "$OUT"
