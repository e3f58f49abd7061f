#!/usr/bin/env bash
# The vLLM backend on a GPU machine (one prepared script; see docs/distributed.md). Run from the repo root:
#   bash benchmarks/gpu/vllm_smoke.sh [MODEL_FOLDER]
# Needs vllm importable (pip install 'vllm>=0.11,<0.40', or the carried wheels of the device README) and
# harnessrl installed. Prints: the contract test, tokens/s engine vs vLLM, seconds per verified weight sync,
# and a short RL run of the weather example generating on vLLM. Last line: one JSON object.
set -euo pipefail
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 VLLM_SERVER_DEV_MODE=1
OUT=${OUT:-/tmp/vllm-smoke}; mkdir -p "$OUT"
MODEL=${1:-$OUT/smollm2}
[ -f "$MODEL/config.json" ] || python -m harnessrl save-model "$MODEL" --model smollm2-135m-instruct
PORT=8011; URL=http://127.0.0.1:$PORT
python -m vllm.entrypoints.openai.api_server --model "$MODEL" --port $PORT --logprobs-mode processed_logprobs \
    --dtype float32 --max-model-len 4096 --gpu-memory-utilization 0.3 > "$OUT/vllm.log" 2>&1 &
SERVER=$!; trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 300); do curl -sf $URL/v1/models >/dev/null && break; sleep 1; done
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader || true
HARNESSRL_VLLM_URL=$URL HARNESSRL_VLLM_MODEL=$MODEL python -m pytest -q tests/policy/test_vllm.py 2>&1 | tee "$OUT/contract.log" | tail -3
python benchmarks/engine_vs_vllm.py --vllm-url $URL --model "$MODEL" | tee "$OUT/engine_vs_vllm.log" | tail -1
python - "$URL" "$MODEL" <<'PY' | tee "$OUT/sync.log"
import json, sys, torch
from harnessrl.policy import Policy
policy = Policy.load(sys.argv[2], vllm_url=sys.argv[1])
state = policy.model.state_dict()
for _ in range(3):
    state = {k: v + 1e-3 * torch.randn_like(v) for k, v in state.items()}
    policy.update_weights(state)
print(json.dumps({"sync_seconds": [round(s, 3) for s in policy.engine.sync_seconds], "probe_gap": policy.engine.verify()}))
PY
python examples/train_weather_agent.py --model "$MODEL" --vllm-url $URL --updates 3 --heldout-repeats 1 | tail -1 | tee "$OUT/train.log"
python - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
last = lambda name: json.loads((out / name).read_text().strip().splitlines()[-1])
print(json.dumps({**last("engine_vs_vllm.log"), **last("sync.log"), "train": last("train.log")}))
PY
