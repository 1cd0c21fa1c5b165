#!/usr/bin/env bash
# Install memrl into .venv and run the quickstart: tiny model + synthetic data → RULER-style
# evaluation → GRPO training (reward curve on the console, runs/quickstart/train/training.png)
# → export → evaluation again. Offline, 2-core CPU, a few minutes including the install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec memrl quickstart --config configs/quickstart.yaml --fresh "$@"
