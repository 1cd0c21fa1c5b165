#!/usr/bin/env bash
# Check colocated vLLM training on this host's GPUs, as a user runs it (2 GPUs or more):
#   1. tests/test_vllm_ranks.py: each rank's engine (worker, weights, KV cache) on its own GPU;
#   2. `memrl train configs/quickstart.yaml --nproc-per-node N rollout.engine=vllm` with
#      model.strategy=replicate (3 steps) and fsdp (killed with SIGKILL during step 3, then
#      resumed on N/2 GPUs to step 4; an uninterrupted N-GPU run of 4 steps beside it);
#   3. the metrics of the resumed steps against the uninterrupted run's (scripts/compare_metrics.py).
#
#   bash scripts/multi_gpu_check.sh [OUT_DIR]     # default runs/multi_gpu_check
# Needs memrl[vllm] (on the lent machine: scripts/carry_vllm.sh) and pytest.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-runs/multi_gpu_check}"
n=$(bash scripts/visible_gpus.sh)  # CUDA_VISIBLE_DEVICES's, else the host's
[ "$n" -ge 2 ] || { echo "needs 2 GPUs or more; this host has $n"; exit 1; }
half=$(( n / 2 ))
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
step() { echo "=== $(date -u +%H:%M:%S) $*"; }

step "placement test ($n GPUs)"
python -m pytest -q -p no:cacheprovider tests/test_vllm_ranks.py 2>&1 | tail -5

step "quickstart model and data"
python - <<'PY' || { echo "could not build the quickstart's model and data"; exit 1; }
from memrl.config import load_config
from memrl.apps.quickstart import prepare_quickstart
from memrl.recipes.config import TrainConfig
prepare_quickstart(load_config(TrainConfig, "configs/quickstart.yaml"))
PY
common=(rollout.engine=vllm rollout.vllm.gpu_memory_utilization=0.3 trainer.save_freq=1
        trainer.test_freq=0 trainer.val_before_train=false "trainer.log_sinks=[jsonl]")

step "replicate, $n GPUs, 3 steps"
/usr/bin/time -f "%e s" memrl train configs/quickstart.yaml --nproc-per-node "$n" "${common[@]}" \
  model.strategy=replicate trainer.total_steps=3 trainer.out_dir="$out/replicate" 2>&1 | tail -4
echo "exit ${PIPESTATUS[0]}"

step "fsdp, $n GPUs, 4 steps (reference)"
/usr/bin/time -f "%e s" memrl train configs/quickstart.yaml --nproc-per-node "$n" "${common[@]}" \
  model.strategy=fsdp trainer.total_steps=4 trainer.out_dir="$out/fsdp_ref" 2>&1 | tail -4
echo "exit ${PIPESTATUS[0]}"

step "fsdp, $n GPUs, killed in step 3"
setsid memrl train configs/quickstart.yaml --nproc-per-node "$n" "${common[@]}" \
  model.strategy=fsdp trainer.total_steps=4 trainer.out_dir="$out/fsdp_kill" \
  > "$out/fsdp_kill.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ -d "$out/fsdp_kill/checkpoints/step_00000002" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.5
done
[ -d "$out/fsdp_kill/checkpoints/step_00000002" ] || { echo "no checkpoint of step 2"; exit 1; }
sleep 2
# the ranks run in sessions of their own (torchrun starts them so): kill them, as a crash
launcher=$(pgrep -f "memrl.distributed.torchrun .*trainer.out_dir=$out/fsdp_kill" | head -1)
ranks=$(pgrep -P "$launcher")
echo "killing ranks $ranks (SIGKILL)"
kill -KILL $ranks
wait $pid
echo "exit $?; metrics rows: $(grep -c '"step"' "$out/fsdp_kill/metrics.jsonl")"

step "fsdp, resumed on $half GPU(s)"
if [ "$half" -gt 1 ]; then launch=(--nproc-per-node "$half"); else launch=(); fi
/usr/bin/time -f "%e s" memrl train configs/quickstart.yaml "${launch[@]}" "${common[@]}" \
  model.strategy=fsdp trainer.total_steps=4 trainer.out_dir="$out/fsdp_kill" --resume 2>&1 | tail -4
echo "exit ${PIPESTATUS[0]}"
python scripts/compare_metrics.py "$out/fsdp_ref/metrics.jsonl" "$out/fsdp_kill/metrics.jsonl"
