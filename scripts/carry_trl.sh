#!/usr/bin/env bash
# The wheels benchmarks/trl_side_by_side.py needs on the lent GPU machine beyond what it has
# (Python 3.12, torch 2.11.0+cu130, transformers 5.17.0, vLLM 0.21.0 and the wheels carried
# for it: shared/notes/gpu-device.md), downloaded here into .carry/trl/ (git-ignored) as one
# tar split in parts under 60 MiB, with its sha256.
#
#   bash scripts/carry_trl.sh            # -> .carry/trl/trl-wheels.tar.part-aa, -ab, ... + .sha256
#
# On the device, with the parts copied into /tmp/parts (one part per call; see the note):
#   cat /tmp/parts/trl-wheels.tar.part-* > /tmp/trl-wheels.tar
#   (cd /tmp && sha256sum -c /tmp/parts/trl-wheels.tar.sha256)
#   mkdir -p /tmp/trlw && tar -xf /tmp/trl-wheels.tar -C /tmp/trlw
#   python -m pip install --no-index --no-deps --no-compile --target /tmp/trl_site /tmp/trlw/*.whl
#   export PYTHONPATH=$PYTHONPATH:/tmp/trl_site     # after vLLM's own target dir (/tmp/site)
#   python -c "import trl, datasets, accelerate; from trl import GRPOTrainer; print(trl.__version__)"
#
# Why these: trl 1.15.0 is the newest TRL that declares vLLM 0.21 (its `vllm` extra:
# 0.21.0 <= vllm <= 0.31.0; trl 1.16.0 wants >= 0.22.0) and it accepts transformers >= 4.56.2.
# Its requirements the device lacks: datasets and datasets' multiprocess and xxhash. The
# device's image has accelerate, pyarrow, pandas and python-dateutil (the library's
# device/KINDS.md, "Python packages already there"), vLLM's carried site has dill 0.4.1, and
# the rest (numpy, packaging, psutil, pyyaml, jinja2, huggingface_hub, fsspec, tqdm,
# filelock) comes with torch, transformers or vLLM. One part of about 2.5 MB.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/.carry/trl"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
wheels=(trl==1.15.0 datasets==5.2.0 multiprocess==0.70.19 xxhash==4.1.0)
rm -rf "$out"
mkdir -p "$out/wheels"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$out/wheels" "${wheels[@]}"
tar -cf "$out/trl-wheels.tar" -C "$out/wheels" .
(cd "$out" && sha256sum trl-wheels.tar > trl-wheels.tar.sha256)
split -b 59m "$out/trl-wheels.tar" "$out/trl-wheels.tar.part-"
rm "$out/trl-wheels.tar"
ls -l "$out/wheels" "$out"
