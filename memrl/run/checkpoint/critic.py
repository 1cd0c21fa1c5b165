"""The critic beside the policy in a checkpoint (`rl.adv_estimator: gae`):

    critic/model.safetensors   the value model's weights (body + head), by parameter name
    critic/optimizer.pt        its AdamW state
    critic/scheduler.pt        its lr schedule
or, for a critic sharded with FSDP (`model.strategy: fsdp`), written by every rank at once:
    critic/sharded/            DCP: {"model": weights, "optim": AdamW state}, by parameter name
    critic/scheduler.pt        (main rank)
A sharded critic is loaded on any number of ranks (DCP reshards), into a sharded or a
replicated critic, as the policy's shards are. A value head on the policy
(critic.value_model: policy_head) keeps only its weights here, `critic/model.safetensors`
(`weight`, `bias`): its AdamW state is in the actor's optimizer, its schedule the actor's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from memrl.errors import MemrlInputError
from memrl.rl.trainer.sharding import is_sharded
from memrl.run.checkpoint.layout import CRITIC_DIR, SHARDED_DIR, first_line
from memrl.run.checkpoint.shards import read_shards, write_shards

WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.pt"
SCHEDULER = "scheduler.pt"


def save_critic_shards(out: Path, critic: Any) -> None:
    """Every rank: its shards of the sharded `critic.model` and `.optimizer` into
    `out/sharded/` (a collective; `save_critic` then writes the rest)."""
    write_shards(out / SHARDED_DIR, critic.model, critic.optimizer)


def save_critic(out: Path, critic: Any) -> None:
    """Main rank: `critic.model`, `.optimizer` (unless sharded: `save_critic_shards` wrote
    them) and `.scheduler` into `out` (optimizer and scheduler: unless None)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    if not is_sharded(critic.model):
        state = {k: v.detach().contiguous().cpu() for k, v in critic.model.state_dict().items()}
        save_file(state, str(out / WEIGHTS))
        if critic.optimizer is not None:
            torch.save(critic.optimizer.state_dict(), out / OPTIMIZER)
    if critic.scheduler is not None:
        torch.save(critic.scheduler.state_dict(), out / SCHEDULER)


def load_critic(checkpoint: Path, critic: Any) -> None:
    """Load a checkpoint's `critic/` into the live critic (weights copied in place). Every
    rank calls it (a sharded checkpoint is read by all at once)."""
    from safetensors.torch import load_file

    where = checkpoint / CRITIC_DIR
    shards = where / SHARDED_DIR
    if not ((where / WEIGHTS).is_file() or shards.is_dir()):
        raise MemrlInputError(
            f"the checkpoint has no {CRITIC_DIR}/{WEIGHTS} or {CRITIC_DIR}/{SHARDED_DIR}/: it "
            "was not trained with rl.adv_estimator=gae. Export it (memrl export) and start a "
            "gae run from the exported model (model.path), or resume it with its own estimator",
            location=str(where),
        )
    if shards.is_dir():
        read_shards(shards, critic.model, critic.optimizer, what="critic")
    elif is_sharded(critic.model):
        raise MemrlInputError(
            "this checkpoint holds a whole (replicated) critic, and model.strategy is fsdp: "
            "resume it with model.strategy=replicate", location=str(where))
    try:
        if not shards.is_dir():
            critic.model.load_state_dict(load_file(str(where / WEIGHTS)))
            if critic.optimizer is not None:
                critic.optimizer.load_state_dict(torch.load(
                    where / OPTIMIZER, map_location="cpu", weights_only=True))
        if critic.scheduler is not None:
            critic.scheduler.load_state_dict(torch.load(where / SCHEDULER, map_location="cpu",
                                                        weights_only=True))
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise MemrlInputError(f"cannot load the critic: {first_line(exc)}",
                              location=str(where)) from None
