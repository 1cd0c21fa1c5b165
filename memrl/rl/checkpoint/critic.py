"""The critic beside the policy in a checkpoint (`rl.adv_estimator: gae`):

    critic/model.safetensors   the value model's weights (body + head), by parameter name
    critic/optimizer.pt  critic/scheduler.pt   its AdamW state and lr schedule
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from memrl.errors import MemrlInputError
from memrl.rl.checkpoint.layout import CRITIC_DIR, first_line

WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.pt"
SCHEDULER = "scheduler.pt"


def save_critic(out: Path, critic: Any) -> None:
    """Write `critic.model`, `.optimizer` and `.scheduler` into `out` (a new directory)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    state = {k: v.detach().contiguous().cpu() for k, v in critic.model.state_dict().items()}
    save_file(state, str(out / WEIGHTS))
    torch.save(critic.optimizer.state_dict(), out / OPTIMIZER)
    torch.save(critic.scheduler.state_dict(), out / SCHEDULER)


def load_critic(checkpoint: Path, critic: Any) -> None:
    """Load a checkpoint's `critic/` into the live critic (weights copied in place)."""
    from safetensors.torch import load_file

    where = checkpoint / CRITIC_DIR
    if not (where / WEIGHTS).is_file():
        raise MemrlInputError(
            f"the checkpoint has no {CRITIC_DIR}/{WEIGHTS}: it was not trained with "
            "rl.adv_estimator=gae. Export it (memrl export) and start a gae run from the "
            "exported model (model.path), or resume it with its own estimator",
            location=str(where),
        )
    try:
        critic.model.load_state_dict(load_file(str(where / WEIGHTS)))
        for name, target in ((OPTIMIZER, critic.optimizer), (SCHEDULER, critic.scheduler)):
            target.load_state_dict(torch.load(where / name, map_location="cpu",
                                              weights_only=True))
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise MemrlInputError(f"cannot load the critic: {first_line(exc)}",
                              location=str(where)) from None
