#!/usr/bin/env bash
# Set up (if needed) and run the test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
HARNESSRL_TEST_PACKAGES=1 bash scripts/setup.sh  # also Debian's chromium for tests/eval/test_report.py
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# one worker a core, each test file on one worker (module fixtures run once, session fixtures once a
# worker); one torch thread a worker: torch's own pool of a thread a core in each would oversubscribe
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
python -m pytest -q -n auto --dist loadfile "$@"
