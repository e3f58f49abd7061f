#!/usr/bin/env bash
# Wheels for a GPU machine whose image has torch but not what harnessrl needs at its floors (a lent H200's
# image of 2026-12-04: no pydantic or jsonschema, transformers 5.17 where pyproject.toml asks >= 5.24):
#   bash benchmarks/gpu/wheels.sh [DIR]     # here, with the venv set up; DIR defaults to .whl (git-ignored)
# then carry DIR to the machine and, there, before the prepared script:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site:$PWD/src
# Each package at the version this venv has, for CPython 3.12 on x86-64 Linux (about 30 MB).
set -euo pipefail
DIR=${1:-.whl}; mkdir -p "$DIR"
PY=${PYTHON:-.venv/bin/python}
PACKAGES="pydantic pydantic-core annotated-types typing-inspection jsonschema jsonschema-specifications referencing
          rpds-py transformers tokenizers huggingface-hub httpx2 httpcore2 truststore hf-xet safetensors kernels tomlkit"
PINS=$("$PY" -c 'import sys, importlib.metadata as m; print(" ".join(f"{p}=={m.version(p)}" for p in sys.argv[1:]))' $PACKAGES)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any -d "$DIR" $PINS
ls -la "$DIR"
