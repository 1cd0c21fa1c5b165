"""Packed micro-batches through flex_attention with `model.compile` on and off (run by
tests/test_update_options.py in a process of its own: the suite sets TORCH_COMPILE_DISABLE=1,
which would make torch.compile a no-op).

    python tests/compile_flex.py MODEL_DIR [ATTN:LAYOUT ...]

Each ATTN:LAYOUT (default flex_attention:packed) is one attention kernel and one layout
(packed: `rl.remove_padding`; padded: the collated rows with their attention mask). For each,
the tiny policy is loaded by `load_policy` (float32, every layer checkpointed) plain and
compiled; the compiled one first runs the packing probe (`check_packed_attention`, as the
actor does before its first packed forward). Then the log-probs, entropies, a loss of both
and the gradients of one training forward and backward (not for flex_attention on the CPU,
where torch runs no flex_attention backward), and the same of a no-grad forward in eval
mode: compiled against plain, and both against the padded sdpa pass (each sample attends to
itself alone). Prints one JSON line: the largest differences (relative to each result's
scale), the probe's verdict, and the flex_attention calls that torch traced into the compiled
layers' graphs (through a backend that records each graph, then hands it to inductor as
`model.compile` does). `DEVICE` (cpu) and `DTYPE` (float32) can be set by a caller that imports
this file: on a GPU, bfloat16 (torch's flex_attention backward finds no kernel for float32
there with transformers' block sizes: NoValidChoicesError, H100, torch 2.11).
"""

from __future__ import annotations

import json
import sys

import torch
from torch._inductor.compile_fx import compile_fx

from memrl.errors import MemrlInputError
from memrl.recipes.config import ModelConfig
from memrl.recipes.models import load_policy
from memrl.rl.maths.batch import Conversation, collate
from memrl.rl.trainer.actor import response_logprobs
from memrl.rl.trainer.packing import check_packed_attention

TRACED: list[str] = []
"""flex_attention operators found in the graphs torch compiled for the decoder layers."""


def recording_backend(gm: torch.fx.GraphModule, example_inputs):
    TRACED.extend(str(n.target) for n in gm.graph.nodes
                  if n.op == "call_function" and "flex_attention" in str(n.target))
    return compile_fx(gm, example_inputs)


_compile = torch.nn.Module.compile


def _recorded_compile(self, *args, **kwargs):
    kwargs.setdefault("backend", recording_backend)
    return _compile(self, *args, **kwargs)


torch.nn.Module.compile = _recorded_compile  # what compile_layers calls, per layer


def sample(prompt, response, traj=0):
    return Conversation(prompt, response, [0.0] * len(response), traj, f"g{traj}", 0, "final")


# Uneven lengths (as tests/test_rl_packing.py): 4 samples in one packed row of 93 tokens.
BATCH = collate([sample(list(range(3, 40)), [7, 8, 9, 2]), sample([5, 6], [11, 12, 13]),
                 sample(list(range(50, 61)), [21]), sample([4] * 20, list(range(30, 45)))],
                pad_id=0)
WEIGHTS = torch.linspace(-1, 1, BATCH["response_mask"].numel()).reshape(
    BATCH["response_mask"].shape)


def passes(model, packed: bool, backward: bool) -> dict:
    """One training forward + backward (if `backward`), then one no-grad forward in eval
    mode: log-probs, entropies, a loss of both and the gradients."""
    out: dict = {"grads": {}}
    if backward:
        model.train()
        model.zero_grad(set_to_none=True)
        lp, ent = response_logprobs(model, BATCH, temperature=0.8, with_entropy=True,
                                    remove_padding=packed)
        loss = (lp * WEIGHTS.to(lp.device)).sum() + 0.1 * ent.sum()
        loss.backward()
        out = {"lp": lp.detach().cpu(), "ent": ent.detach().cpu(), "loss": loss.detach().cpu(),
               "grads": {n: p.grad.cpu() for n, p in model.named_parameters()
                         if p.grad is not None}}
    model.eval()
    with torch.no_grad():
        lp, ent = response_logprobs(model, BATCH, temperature=0.8, with_entropy=True,
                                    remove_padding=packed)
        loss = (lp * WEIGHTS.to(lp.device)).sum() + 0.1 * ent.sum()
    model.train()
    out.update({"eval_lp": lp.cpu(), "eval_ent": ent.cpu(), "eval_loss": loss.cpu()})
    return out


def diff(a: dict, b: dict) -> dict[str, float]:
    """Largest difference of each result of `passes`, relative to its scale."""
    assert a["grads"].keys() == b["grads"].keys()
    out = {}
    for k in ("lp", "ent", "loss", "eval_lp", "eval_ent", "eval_loss"):
        if k in b:  # relative to the largest magnitude
            out[k] = ((a[k] - b[k]).abs().max() / b[k].abs().max()).item()
    if b["grads"]:  # each parameter's gradient relative to its own largest entry
        out["grads"] = max(((a["grads"][n] - b["grads"][n]).abs().max() /
                            b["grads"][n].abs().max()).item() for n in b["grads"])
    return out


DEVICE = "cpu"
DTYPE = "float32"


def load(model_dir: str, attn: str, compile: bool):
    return load_policy(ModelConfig(path=model_dir, dtype=DTYPE, device=DEVICE,
                                   attn_implementation=attn, compile=compile,
                                   gradient_checkpointing=True))[0]


def main(model_dir: str, *cases: str) -> None:
    out: dict = {}
    for case in cases or ("flex_attention:packed",):
        attn, layout = case.split(":")
        packed = layout == "packed"
        # torch runs no flex_attention backward on the CPU: forward passes only.
        backward = attn != "flex_attention" or DEVICE != "cpu"
        reference = passes(load(model_dir, "sdpa", False), False, backward)
        plain = passes(load(model_dir, attn, False), packed, backward)
        model = load(model_dir, attn, True)
        try:  # first, as the actor runs it: the compiled layers' first graphs
            check_packed_attention(model)
            probe = "ok"
        except MemrlInputError as e:
            probe = str(e)
        compiled = passes(model, packed, backward)
        out[case] = {"compiled_vs_plain": diff(compiled, plain),
                     "compiled_vs_separate": diff(compiled, reference),
                     "plain_vs_separate": diff(plain, reference), "probe": probe,
                     "grads": len(compiled["grads"])}
    out["traced_flex_attention"] = TRACED
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
