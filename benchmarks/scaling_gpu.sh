#!/usr/bin/env bash
# Weak scaling on this host's GPUs (the same work per GPU): the PPO update alone and the full
# GRPO step with colocated vLLM, on 1, 2, ... N GPUs (powers of two), each N under torchrun.
#
#   bash benchmarks/scaling_gpu.sh [OUT_DIR] [SHAPE]   # default benchmarks/results/scaling, 0.5b
#   python benchmarks/scaling_report.py OUT_DIR        # the efficiencies, as JSON and a table
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-benchmarks/results/scaling}"
shape="${2:-0.5b}"
n=$(bash scripts/visible_gpus.sh)  # CUDA_VISIBLE_DEVICES's, else the host's
mkdir -p "$out"
launch() {  # N SCRIPT ARGS...
  local k=$1; shift
  if [ "$k" -eq 1 ]; then python "$@"; else
    python -m memrl.distributed.torchrun --standalone --nproc-per-node="$k" "$@"; fi
}
for k in 1 2 4 8; do
  [ "$k" -le "$n" ] || break
  echo "=== $(date -u +%H:%M:%S) update only, $k GPU(s)"
  launch "$k" benchmarks/train_step_gpu.py --update-only --shape "$shape" --strategy fsdp \
    --samples 48 --budgets 16384 --steps 4 --json-out "$out/update_${shape}_gpus$k.json" \
    2>&1 | tail -3
done
for k in 1 2 4 8; do
  [ "$k" -le "$n" ] || break
  echo "=== $(date -u +%H:%M:%S) full step (colocated vLLM), $k GPU(s)"
  launch "$k" benchmarks/train_step_gpu.py --shape "$shape" --strategy fsdp --engine vllm \
    --steps 3 --train-batch-size $((4 * k)) --out-dir "/tmp/scaling_step_$k" \
    --json-out "$out/step_${shape}_gpus$k.json" 2>&1 | tail -3
done
