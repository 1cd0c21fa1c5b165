#!/usr/bin/env bash
# Install memrl with its test extras into .venv and run the whole test suite (CPU, ~minutes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup_env.sh test
# Hugging Face libraries must never reach for the network in tests.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec python -m pytest -n "${MEMRL_TEST_WORKERS:-2}" --durations=15 "$@" tests
