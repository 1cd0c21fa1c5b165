#!/usr/bin/env bash
# The number of GPUs this process may use: CUDA_VISIBLE_DEVICES's entries when it is set (a
# host shared with other runs), else every GPU nvidia-smi lists.
#   n=$(bash scripts/visible_gpus.sh)
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .
else nvidia-smi -L | grep -c '^GPU '; fi
