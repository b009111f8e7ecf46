#!/usr/bin/env bash
# One short GPU window spent on paper-protocol runs (docs/results.md, "GPU windows").
#
#   OUT=<folder> BUDGET_S=430 K=5 tools/gpu_window.sh task=listops attn=softmax,skeinformer,... [overrides]
#
# Runs the given attentions side by side on one GPU (K at a time, each allocator capped at what a
# 16 GB V100 leaves free: $LRA_MEMORY_LIMIT_GIB, so the V100 fit of hardware=v100_16gb holds as it
# would there), stops them with SIGTERM at BUDGET_S seconds after the script started (the runs write
# an interrupted record and keep checkpoints/last.ckpt), and leaves under $OUT at most 8 files of at
# most 15 MiB (what a device window brings back):
#   runs.tar.gz.partNN + runs.sha256   the whole runs root (records, metrics, logs, checkpoints), split:
#                 the pack the next window unpacks (CARRY=<folder holding the parts>) before it runs the
#                 same command, so each unfinished run resumes where it stopped;
#   window.tar.gz this script's log, summary.txt (each run's status, last step, accuracies), gpu.csv
#                 (the GPU's use every 5 s), env.txt and each run's console.
# CARRY may also name one runs.tar.gz.
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
W=$(mktemp -d)                 # this window's logs; $OUT receives only the bundle
log() { echo "[gpu_window $(( $(date +%s) - t0 ))s] $*" | tee -a "$W/window.log"; }

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
  > "$W/env.txt" 2>&1
cat "$W/env.txt"
"$PY" -c "import lra.train" || { log "lra.train does not import: see env.txt"; exit 3; }
git rev-parse HEAD > "$W/commit.txt" 2>/dev/null || true

if [ -n "${CARRY:-}" ]; then
  if [ -d "$CARRY" ]; then
    cat "$CARRY"/runs.tar.gz.part* > "$W/carry.tar.gz"
    (cd "$W" && sed 's/ .*/  carry.tar.gz/' "$CARRY/runs.sha256" | sha256sum -c --quiet) \
      || { log "the pack in $CARRY does not match its runs.sha256: not unpacked"; exit 4; }
    CARRY=$W/carry.tar.gz
  fi
  tar -xzf "$CARRY" -C "$LRA_RUNS" && log "unpacked the carried pack into $LRA_RUNS"
fi

nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$W/gpu.csv" 2>/dev/null &
smi=$!

log "data: $task"
"$PY" -m lra.data task="$task" "${extra[@]}" > "$W/data.log" 2>&1 || { log "data failed: see data.log"; tail -5 "$W/data.log"; }
tail -2 "$W/data.log"

pids=(); names=()
IFS=, read -ra rows <<< "$attns"
launch() {
  local attn=$1
  LRA_MEMORY_LIMIT_GIB=$CAP_GIB "$PY" -m lra.train task="$task" attn="$attn" trainer.progress=false \
    "${extra[@]}" > "$W/$attn.console" 2>&1 &
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

"$PY" - "$LRA_RUNS" > "$W/summary.txt" <<'EOF'
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
cat "$W/summary.txt"
tar -czf "$W/runs.tar.gz" -C "$LRA_RUNS" . && (cd "$W" && sha256sum runs.tar.gz > "$OUT/runs.sha256" \
  && split -b 15M -d runs.tar.gz "$OUT/runs.tar.gz.part") && log "packed $(du -h "$W/runs.tar.gz" | cut -f1) runs.tar.gz"
log "done"
tar -czf "$OUT/window.tar.gz" -C "$W" --exclude runs.tar.gz --exclude carry.tar.gz .
