#!/usr/bin/env bash
# Install memrl into .venv and run the quickstart: a tiny model built by memrl, evaluated,
# warm-started on oracle trajectories, trained with GRPO on the answer reward, evaluated
# after each stage (runs/quickstart/accuracy.png). Offline, 2-core CPU. Interrupted, the same
# command continues where it stopped; --fresh starts over.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec memrl quickstart "$@"  # configs/quickstart.yaml and configs/quickstart_sft.yaml
