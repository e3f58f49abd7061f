#!/usr/bin/env bash
# Set up (if needed) and run the test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# headless Chromium (Debian's package) for tests/eval/test_report.py; needs root and the Debian mirror
command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)
# one worker a core, each test file on one worker (module fixtures run once, session fixtures once a
# worker); one torch thread a worker: torch's own pool of a thread a core in each would oversubscribe
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
python -m pytest -q -n auto --dist loadfile "$@"
