#!/usr/bin/env bash
# One short GPU window spent on paper-protocol runs (docs/results.md, "GPU windows").
#
#   OUT=<folder> BUDGET_S=430 K=5 tools/gpu_window.sh task=listops attn=softmax,skeinformer,... [overrides]
#
# Runs the given attentions side by side on one GPU (K at a time, each allocator capped at what a
# 16 GB V100 leaves free: $LRA_MEMORY_LIMIT_GIB, so the V100 fit of hardware=v100_16gb holds as it
# would there), stops them with SIGTERM at BUDGET_S seconds after the script started (the runs write
# an interrupted record and keep checkpoints/last.ckpt), and leaves under $OUT:
#   runs.tar.gz   the whole runs root (records, metrics, logs, last.ckpt): unpack it into runs/ on the
#                 next machine and run the same command; each unfinished run resumes where it stopped;
#   summary.txt   each run's status, steps and accuracies; gpu.csv, the GPU's use every 5 s; env.txt.
# A pack carried from an earlier window is unpacked first: CARRY=<path to runs.tar.gz>.
# Offline node without hydra: WHEELS=<folder of hydra-core, omegaconf, antlr4 ...> joins PYTHONPATH
# (docs/facts.md §10).
set -u
t0=$(date +%s)
: "${OUT:?set OUT to the folder that receives the pack}"
BUDGET_S=${BUDGET_S:-430}      # when the runs get SIGTERM, in seconds from the start of this script
GRACE_S=${GRACE_S:-50}         # how long they have to write their interrupted record
K=${K:-5}                      # runs on the GPU at once
CAP_GIB=${CAP_GIB:-15.02}      # a V100-SXM2-16GB's 15.77 GiB less a 0.75 GiB CUDA context (conf/hardware/v100_16gb.yaml)
PY=$(command -v python || command -v python3)
ROOT=$(pwd)
export PYTHONPATH="$ROOT${WHEELS:+:$WHEELS}${PYTHONPATH:+:$PYTHONPATH}"
export LRA_RUNS=${LRA_RUNS:-$ROOT/runs}
mkdir -p "$OUT" "$LRA_RUNS"
log() { echo "[gpu_window $(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/window.log"; }

task=listops; attns=""; extra=()
for a in "$@"; do
  case "$a" in
    task=*) task=${a#task=} ;;
    attn=*) attns=${a#attn=} ;;
    *) extra+=("$a") ;;
  esac
done
[ -n "$attns" ] || { echo "gpu_window: give attn=a,b,c (the rows to run)"; exit 2; }

{ date -u; hostname; pwd; "$PY" -V; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader;
  "$PY" -c "import torch, lightning, hydra, omegaconf; print('torch', torch.__version__, 'lightning', lightning.__version__, 'hydra', hydra.__version__, torch.cuda.get_device_name(0))"; } \
  > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
"$PY" -c "import lra.train" || { log "lra.train does not import: see env.txt"; exit 3; }
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true

if [ -n "${CARRY:-}" ] && [ -f "$CARRY" ]; then
  tar -xzf "$CARRY" -C "$LRA_RUNS" && log "unpacked $CARRY into $LRA_RUNS"
fi

nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/gpu.csv" 2>/dev/null &
smi=$!

log "data: $task"
"$PY" -m lra.data task="$task" "${extra[@]}" > "$OUT/data.log" 2>&1 || { log "data failed: see data.log"; tail -5 "$OUT/data.log"; }
tail -2 "$OUT/data.log"

pids=(); names=()
IFS=, read -ra rows <<< "$attns"
launch() {
  local attn=$1
  LRA_MEMORY_LIMIT_GIB=$CAP_GIB "$PY" -m lra.train task="$task" attn="$attn" trainer.progress=false \
    "${extra[@]}" > "$OUT/$attn.console" 2>&1 &
  pids+=($!); names+=("$attn")
  log "started $attn (pid $!)"
}
next=0
while [ $next -lt ${#rows[@]} ] && [ ${#pids[@]} -lt "$K" ]; do launch "${rows[$next]}"; next=$((next + 1)); done

# wait for the budget; a slot a finished run frees takes the next row
while [ $(( $(date +%s) - t0 )) -lt "$BUDGET_S" ]; do
  alive=0
  for i in "${!pids[@]}"; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then alive=$((alive + 1)); else
      if [ -n "${pids[$i]}" ]; then wait "${pids[$i]}"; log "${names[$i]} exited $?"; pids[$i]=""; fi
    fi
  done
  if [ $alive -lt "$K" ] && [ $next -lt ${#rows[@]} ]; then launch "${rows[$next]}"; next=$((next + 1)); continue; fi
  [ $alive -eq 0 ] && [ $next -ge ${#rows[@]} ] && break
  sleep 5
done

log "budget reached: SIGTERM to the runs still training"
for p in "${pids[@]}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null; done
for _ in $(seq "$GRACE_S"); do
  alive=0; for p in "${pids[@]}"; do [ -n "$p" ] && kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive -eq 0 ] && break; sleep 1
done
for i in "${!pids[@]}"; do
  p=${pids[$i]}; [ -n "$p" ] || continue
  if kill -0 "$p" 2>/dev/null; then kill -KILL "$p"; log "${names[$i]} killed after the grace period"; fi
  wait "$p"; log "${names[$i]} exited $?"
done
kill "$smi" 2>/dev/null

"$PY" - "$LRA_RUNS" > "$OUT/summary.txt" <<'EOF'
import csv, json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).rglob("result.json")):
    r = json.loads(f.read_text())
    m = f.parent / "metrics.csv"
    rows = list(csv.DictReader(open(m))) if m.exists() else []
    last = max((int(x["step"]) for x in rows if x.get("step")), default=None)
    vals = [(round(float(x["val/acc"]), 4), int(x["step"])) for x in rows if x.get("val/acc")]
    print(f"{str(f.parent.relative_to(sys.argv[1])):55s} {r.get('status'):11s} last logged step {last}, "
          f"val acc {vals[-1] if vals else None} (best {max(vals) if vals else None}), test {r.get('test_acc')}, "
          f"{r.get('time_per_1k_steps_s')} s/1k steps")
EOF
cat "$OUT/summary.txt"
tar -czf "$OUT/runs.tar.gz" -C "$LRA_RUNS" . && log "packed $(du -h "$OUT/runs.tar.gz" | cut -f1) runs.tar.gz"
log "done"
