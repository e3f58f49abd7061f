#!/usr/bin/env bash
# Set up, then run the main job on the embedded default: tiny-base -> synthetic corpus in embedded
# Chroma -> expert demonstrations -> SFT -> RL -> held-out eval before and after; then the HTML report.
# Extra arguments go to `harnessrl train` (e.g. a config file, --corpus/--tasks, --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --out | --resume) if ((i + 1 < ${#args[@]})); then out="${args[$((i + 1))]}"; fi ;;
    --out=* | --resume=*) out="${args[$i]#*=}" ;;  # the form click also takes: else --out runs/main overrode it
  esac
done
if [[ -z "$out" ]]; then out=runs/main; args+=(--out "$out"); fi
harnessrl train "${args[@]}"
harnessrl report "$out"
echo "run folder: $out (summary.json, report.html)"
