#!/usr/bin/env bash
# Pretrain tiny-base from scratch on a lent GPU (one prepared script), two mixtures side by side:
#   bash benchmarks/gpu/pretrain_tiny_base.sh
# `plain`: stage 4c's mixture (list_calls 18 %) with record drills (--follow-ups 4); `history`: the same
# with 0-6 earlier exchanges before each item (long contexts). Each gets half the CPU cores for packing
# batches (--workers). A 40-second calibration run measures the steps a minute, then each run takes
# STEP_SECONDS of steps (cosine schedule over them), exports fp16 with a 40-item probe, and $OUT gets
# <name>.tgz (export folder + log) and <name>-fp32.safetensors. The CPU reproduction is the same
# command line with --device cpu and no --workers (see src/harnessrl/policy/tiny_base/README.md).
set -euo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/pretrain-gpu}; mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda}; ROWS=${ROWS:-128}; WORKERS=${WORKERS:-7}; STEP_SECONDS=${STEP_SECONDS:-390}
CAL_SECONDS=${CAL_SECONDS:-40}; WORK=${WORK:-/tmp/pretrain-work}; rm -rf "$WORK"; mkdir -p "$WORK"
trap 'tail -n 15 "$WORK"/*.log' ERR
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
common=(--device "$DEVICE" --rows "$ROWS" --width 1024 --workers "$WORKERS" --lr 2e-3 --warmup 200 --seed 0
        --weights list_calls=0.25 --follow-ups 4 --probe-minutes 1000 --save-minutes 1000 --probe-items 40)
declare -A extra=([plain]="" [history]="--history 0-6")
run() {  # name steps minutes out export
    python3 scripts/pretrain_tiny_base.py "${common[@]}" ${extra[$1]} --steps "$2" --minutes "$3" --out "$4" \
        --export-dir "$5" > "$4.log" 2>&1
}
for name in plain history; do run $name 100000 "$(python3 -c "print($CAL_SECONDS/60)")" "$WORK/cal-$name" "$WORK/x" & done
wait
steps=$(python3 - "$WORK" "$STEP_SECONDS" <<'PY'
import json, pathlib, sys
rates = []
for name in ("plain", "history"):
    rows = [json.loads(x) for x in (pathlib.Path(sys.argv[1]) / f"cal-{name}" / "log.jsonl").read_text().splitlines()]
    first = min(4, len(rows) // 2)  # past the first steps (workers starting, kernels warming up)
    rates.append((len(rows) - 1 - first) / (rows[-1]["wall_seconds"] - rows[first]["wall_seconds"]))
print(int(min(rates) * float(sys.argv[2])))
PY
)
echo "calibration: $steps steps in ${STEP_SECONDS}s"
for name in plain history; do run $name "$steps" 30 "$WORK/$name" "$WORK/$name-export" & done
wait
for name in plain history; do
    cp "$WORK/$name.log" "$WORK/$name/log.jsonl" "$WORK/$name-export/"
    tar -C "$WORK" -czf "$OUT/$name.tgz" "$name-export"
    cp "$(ls -d "$WORK/$name"/checkpoints/step-* | tail -1)/model.safetensors" "$OUT/$name-fp32.safetensors"
    tail -2 "$WORK/$name.log"
done
ls -la "$OUT"
