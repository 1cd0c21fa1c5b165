"""One GRPO update with `model.compile` on and off, on the same batch (run by
tests/test_update_options.py in a process of its own: `scripts/test.sh` sets
TORCH_COMPILE_DISABLE=1 for the suite, which would make torch.compile a no-op).

    python tests/compile_step.py MODEL_DIR DATA_DIR OUT_DIR [OVERRIDE ...]

Prints one JSON line: the largest differences of the logged loss terms and gradient norm,
of the gradients and of the parameters after the step between the compiled and the plain
policy, how far the step moved the weights, whether the compiled policy's
rollouts (hf engine, sampled, seeded) equal the plain policy's, whether both name their
weights alike (checkpoints, weight sync), how many graphs torch compiled during each
rollout and update (torch's dynamo counters), and the seconds each took.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from test_rl_old_logprobs import make_config, step

from memrl.recipes import grpo
from memrl.rl.maths.batch import RolloutBatch

# Micro-batches of a small token budget: several shapes, so the compiled layers go dynamic,
# and the recomputation of a checkpointed layer must find the forward's graph.
SETTINGS = ("rl.use_dynamic_bsz=true", "rl.max_tokens_per_micro_batch=400",
            "rl.use_kl_loss=true", "rl.kl_loss_coef=0.1", "rl.entropy_coeff=0.01")


def rollouts(run) -> list:
    """As `test_rl_old_logprobs.rollout_batch`, whose trajectories are compared here."""
    return run.task.rollout(run.engine, run.stream.records[:2], num_samples=4, seed=0,
                            temperature=1.0, top_p=1.0)


def main(model_dir: str, data_dir: str, out_dir: str, *extra: str) -> None:
    runs = {name: grpo.setup(make_config(Path(model_dir), Path(data_dir), Path(out_dir) / name,
                                         *SETTINGS, flag, *extra))
            for name, flag in (("plain", "model.compile=false"),
                               ("compiled", "model.compile=true"))}
    from torch._dynamo.utils import counters

    def graphs() -> int:
        return int(counters["stats"]["unique_graphs"])

    trajectories, seconds, compiled_graphs = {}, {}, {}
    for name, run in runs.items():
        t, before = time.perf_counter(), graphs()
        trajectories[name] = rollouts(run)
        seconds[f"rollout_{name}"] = time.perf_counter() - t
        compiled_graphs[f"rollout_{name}"] = graphs() - before
    same_rollouts = [[turn.response_ids for turn in traj.turns]
                     for traj in trajectories["plain"]] == \
                    [[turn.response_ids for turn in traj.turns]
                     for traj in trajectories["compiled"]]
    batch = RolloutBatch.from_trajectories(trajectories["plain"], overlong="keep")
    batch = batch.with_logprobs(None, runs["plain"].reference.logprobs(batch))
    batch = batch.with_advantages(torch.linspace(-1, 1, batch.num_trajectories))
    results = {}
    for name, run in runs.items():  # the old log-probs of the separate (no-grad) pass
        t, before = time.perf_counter(), graphs()
        stats, grads, params, _ = step(run, batch, "recompute")
        results[name] = stats.metrics(), grads, params
        seconds[f"update_{name}"] = time.perf_counter() - t
        compiled_graphs[f"update_{name}"] = graphs() - before
    (pm, pg, pp), (cm, cg, cp) = results["plain"], results["compiled"]
    metric_keys = [k for k in pm if k.startswith("actor/")]
    micros = runs["plain"].actor.micro_batches(batch, list(range(len(batch.conversations))))
    print(json.dumps({
        "micro_batches": len(micros),
        "micro_batch_lengths": sorted({max(batch.conversations[i].num_tokens for i in micro)
                                       for micro in micros}),
        "metric_keys": sorted(metric_keys),
        "metric_diff": max(abs(pm[k] - cm[k]) for k in metric_keys),
        "grad_keys_equal": pg.keys() == cg.keys() and len(pg) > 0,
        "grad_diff": max((pg[n] - cg[n]).abs().max().item() for n in pg),
        "param_diff": max((pp[n] - cp[n]).abs().max().item() for n in pp),
        "param_moved": max((pp[n] - runs["compiled"].reference.model.state_dict()[n])
                           .abs().max().item() for n in pp),
        "same_rollouts": same_rollouts,
        "same_state_dict_names": list(runs["plain"].actor.model.state_dict()) ==
                                 list(runs["compiled"].actor.model.state_dict()),
        "compiled_graphs": compiled_graphs,
        "seconds": seconds,
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
