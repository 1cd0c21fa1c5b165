"""One colocated vLLM engine per rank, for `test_vllm_ranks.py`:

    torchrun --standalone --nproc-per-node 2 tests/vllm_ranks.py MODEL_DIR OUT.json

Every rank joins the trainer's process group (gloo on CPU; nccl, one GPU per rank, on a
machine with GPUs), builds its engine, loads the policy's weights into it from a copy of the
model on its own device, and generates greedily before and after; rank 0 writes what every
rank saw: its device, where its engine's worker, weights and KV cache live, how the engine
was launched, and the generated tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from memrl.distributed import destroy_process_group, init_process_group
from memrl.inference import load_model
from memrl.inference.base import SamplingParams
from memrl.inference.config import VLLMConfig
from memrl.inference.vllm import VLLMEngine


def main(model_dir: str, out: str) -> None:
    dist = init_process_group(120, always=True)
    cuda = torch.cuda.is_available()
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = VLLMEngine(model_dir, tokenizer, VLLMConfig(
        max_model_len=512, kv_cache_memory_bytes=1 << 27, gpu_memory_utilization=0.2))
    prompt = tokenizer("Where does Anna live?")["input_ids"]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate([prompt], greedy)[0].token_ids
    policy = load_model(model_dir, device=device, dtype="float32")
    engine.sync_weights(policy, 1)
    after = engine.generate([prompt], greedy)[0].token_ids
    seen = dist.all_gather({
        "rank": dist.rank, "device": device, "placement": engine.placement,
        "backend": engine.engine_kwargs().get("distributed_executor_backend"),
        "before": before, "after": after,
    })
    engine.close()
    if dist.is_main:
        Path(out).write_text(json.dumps(seen))
    destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
