#!/usr/bin/env bash
# Pretrain tiny-base from scratch on a lent GPU (one prepared script):
#   bash benchmarks/gpu/pretrain_tiny_base.sh [STEPS [MORE FLAGS...]]
# Stage 4c's mixture (list_calls 18 %) with record drills (--follow-ups 4), 128 rows of 1,024 tokens a
# step, batches packed by 14 worker processes. On an H200 (16 cores) a step took 0.03 s (4-7 M tokens/s,
# the workers' packing the limit), so the default 2,400 steps take about 80 s of steps plus a minute of
# start-up and the export's probe. $OUT gets tiny-base.tgz (the fp16 export with its README, loss.png and
# log) and tiny-base-fp32.safetensors. The CPU reproduction is the same command line with --device cpu
# (see src/harnessrl/policy/tiny_base/README.md): hours on 2 cores, resumable with --resume.
# Flags after STEPS are passed on and win over the script's, e.g. the long-context run of 2026-12-04
# (3,000 steps, 64 rows of 2,048 tokens, 0-12 answered exchanges before each item):
#   bash benchmarks/gpu/pretrain_tiny_base.sh 3000 --history 0-12 --width 2048 --rows 64
# A run stopped by --minutes is checkpointed and exported as it stands (--export-only).
# The machine needs harnessrl's requirements at their floors: `bash benchmarks/gpu/wheels.sh` here makes the
# wheels to carry (with transformers 5.17 the export's probe read 0.0 on every skill, now refused at import).
set -euo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/pretrain-gpu}; mkdir -p "$OUT"
STEPS=${1:-2400}; shift || true; WORK=${WORK:-/tmp/pretrain-work}; rm -rf "$WORK"; mkdir -p "$WORK"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
FLAGS=(--device cuda --workers 14 --rows 128 --width 1024 --lr 2e-3 --warmup 100 --seed 0 --weights list_calls=0.25
       --follow-ups 4 --steps "$STEPS" --probe-minutes 1000 --probe-items 40 "$@" --out "$WORK/run" --export-dir "$WORK/tiny-base")
python3 scripts/pretrain_tiny_base.py "${FLAGS[@]}" 2>&1 | grep -v "Writing model" | tee "$WORK/run.log"
[ -d "$WORK/tiny-base" ] || python3 scripts/pretrain_tiny_base.py "${FLAGS[@]}" --export-only 2>&1 | tee -a "$WORK/run.log"
cp "$WORK/run.log" "$WORK/run/log.jsonl" "$WORK/tiny-base/"
tar -C "$WORK" -czf "$OUT/tiny-base.tgz" tiny-base
cp "$(ls -d "$WORK"/run/checkpoints/step-* | tail -1)/model.safetensors" "$OUT/tiny-base-fp32.safetensors"
ls -la "$OUT"
