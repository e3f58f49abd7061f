#!/usr/bin/env bash
# The main job's default config with seeds 0, 1, 2, one after another (the learning issue's three
# runs), then a table of their summary.json. Extra arguments go to every `harnessrl train` (e.g.
# --corpus C --tasks T). Run folders: $ROOT/seed-N (ROOT defaults to runs/seeds).
#   bash scripts/main_seeds.sh [--corpus C --tasks T]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh  # a fresh clone has no .venv yet
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
root="${ROOT:-runs/seeds}"
mkdir -p "$root"
for seed in 0 1 2; do
  if [[ ! -f "$root/seed-$seed/summary.json" ]]; then
    echo "seed: $seed" > "$root/seed-$seed.yaml"
    if [[ -f "$root/seed-$seed/config.yaml" ]]; then
      harnessrl train --resume "$root/seed-$seed"
    else
      harnessrl train "$root/seed-$seed.yaml" "$@" --out "$root/seed-$seed"
    fi
  fi
done
python - "$root" <<'EOF'
import json, sys
from pathlib import Path

keys = ("heldout_success_before", "heldout_success_after", "heldout_gain_ci", "heldout_success_greedy_before",
        "heldout_success_greedy_after", "chosen_update", "wall_seconds")
rows = {p.parent.name: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("seed-*/summary.json"))}
for name, s in rows.items():
    print(name, " ".join(f"{k}={s[k]}" for k in keys))
print(json.dumps({name: {k: s[k] for k in keys} for name, s in rows.items()}))
EOF
