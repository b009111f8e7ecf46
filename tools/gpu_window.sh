#!/usr/bin/env bash
# One short GPU window spent on a grid's jobs, in one command (docs/gpu.md has the whole procedure).
#
#   OUT=<folder> BUDGET_S=420 K=5 [CARRY=<pack folder>] [WHEELS=<site folder>] \
#     bash tools/gpu_window.sh grid=skeinformer_table1 task=listops seed=0 [overrides]
#
# 1. CARRY: the pack an earlier window left (python -m lra.tools.carry unpack: checked, then unpacked into
#    the runs root; a run already there is kept).
# 2. The sweep (python -m lra.tools.sweep <args> budget=... carry=true jobs_per_gpu=K parallel=K): the grid's
#    unfinished jobs in its order, K side by side on the GPU, each keeping the fit of its hardware profile
#    (hardware=v100_16gb: the V100's micro-batch and accumulation, its allocator capped at a V100's 15.02 GiB);
#    resumed runs continue from last.ckpt; at BUDGET_S seconds after this script started the runs still
#    training get SIGTERM (interrupted record, last.ckpt kept). No probes (probe=false): on a GPU a probe
#    compiles its model and would eat the window; the jobs a window cannot estimate start in the grid's order.
# 3. What comes back, at most 8 files of at most 15 MiB (what a device window returns), under $OUT:
#    runs.tar.gz.partNN + runs.sha256   the unfinished runs and the sweep's manifest and measured rates:
#                                       the next window's CARRY (python -m lra.tools.carry pack);
#    window.tar.gz                      results/ (every finished run's result.json, metrics.csv, train.log,
#                                       .hydra/: python -m lra.tools.carry export), pack.json, this script's
#                                       log, the sweep's output, summary.txt, gpu.csv (the GPU's use every 5 s),
#                                       env.txt.
# Offline node without hydra: WHEELS=<folder from tools/offline_site.sh> joins PYTHONPATH.
set -u
t0=$(date +%s)
: "${OUT:?set OUT to the folder that receives what the window brings back}"
BUDGET_S=${BUDGET_S:-420}      # when the runs get SIGTERM, in seconds from the start of this script
K=${K:-5}                      # runs on the GPU at once
PY=$(command -v python || command -v python3)
ROOT=$(pwd)
export PYTHONPATH="$ROOT${WHEELS:+:$WHEELS}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export LRA_RUNS=${LRA_RUNS:-$ROOT/runs}
mkdir -p "$OUT" "$LRA_RUNS"
W=$(mktemp -d)                 # this window's logs; $OUT receives only the bundle
log() { echo "[gpu_window $(( $(date +%s) - t0 ))s] $*" | tee -a "$W/window.log"; }
[ $# -gt 0 ] || { echo "gpu_window: give the sweep's arguments (grid=<name> [overrides])"; exit 2; }

{ date -u; hostname; pwd; "$PY" -V; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader;
  "$PY" -c "import torch, lightning, hydra, omegaconf; print('torch', torch.__version__, 'lightning', lightning.__version__, 'hydra', hydra.__version__, torch.cuda.get_device_name(0))"; } \
  > "$W/env.txt" 2>&1
cat "$W/env.txt"
"$PY" -c "import lra.train, lra.tools.sweep" || { log "the harness does not import: see env.txt"; exit 3; }
git rev-parse HEAD > "$W/commit.txt" 2>/dev/null || true

if [ -n "${CARRY:-}" ]; then
  "$PY" -m lra.tools.carry unpack "$CARRY" --runs "$LRA_RUNS" 2>&1 | tee "$W/unpack.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { log "the pack in $CARRY was not unpacked (see above): stopping"; exit 4; }
fi

nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$W/gpu.csv" 2>/dev/null &
smi=$!

left=$(( BUDGET_S - ($(date +%s) - t0) ))
log "sweep: $* (budget ${left} s, $K per GPU)"
"$PY" -m lra.tools.sweep "$@" budget="$left" carry=true jobs_per_gpu="$K" parallel="$K" hydra/launcher=local \
  probe=false trainer.progress=false progress=60 2>&1 | tee "$W/sweep.log"
log "sweep exited ${PIPESTATUS[0]}"
kill "$smi" 2>/dev/null

"$PY" - "$LRA_RUNS" > "$W/summary.txt" <<'EOF'
import csv, json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).rglob("result.json")):
    r = json.loads(f.read_text())
    m = f.parent / "metrics.csv"
    rows = list(csv.DictReader(open(m))) if m.exists() else []
    vals = [(round(float(x["val/acc"]), 4), int(x["step"])) for x in rows if x.get("val/acc")]
    print(f"{str(f.parent.relative_to(sys.argv[1])):55s} {r.get('status'):13s} steps {r.get('steps')}, "
          f"val acc {vals[-1] if vals else None} (best {max(vals) if vals else None}), test {r.get('test_acc')}, "
          f"{r.get('time_per_1k_steps_s')} s/1k steps, micro-batch {r.get('micro_batch')} x {r.get('accum_steps')}")
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
