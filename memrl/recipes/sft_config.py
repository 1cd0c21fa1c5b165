"""The warm-start config: every knob of `memrl sft`, typed and validated.

Sections are those of `TrainConfig` where they mean the same (`agent` and the agent's own
section, `model`, `optim`, `trainer`); `data` says where the teacher trajectories come from
and `sft` how they are batched. Any task that provides an oracle (`Task.oracle`) can be
warm-started; MemAgent's can also replay a trajectories file.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from memrl.config import StrictModel
from memrl.recipes.config import AgentSection, ModelConfig, TrainerConfig
from memrl.rl.config import OptimConfig


class SFTDataConfig(StrictModel):
    train_file: str
    """Questions (memrl / HotpotQA JSONL, parquet, RULER): the oracle answers them, or the
    trajectories file's lines are replayed over them (matched by id)."""
    val_file: str | None = None
    """Validation questions: the oracle's trajectories on them give `val/nll`."""
    format: Literal["auto", "official", "ircot", "memrl", "parquet", "ruler", "locomo"] = "auto"
    """The format of train_file / val_file for the task's loader (as data.format of
    `memrl train`)."""
    trajectories: str | None = None
    """A `memrl eval` trajectories file (e.g. of a teacher model or a served API)
    to imitate instead of the oracle (rejection sampling: only lines scoring at least
    min_score). None: the scripted oracle on train_file (needs supporting documents)."""
    min_score: float = 1.0
    """Keep a trajectories-file line only if its `scores[score_key]` reaches this."""
    score_key: str = Field("sub_em", min_length=1)
    """Which logged score min_score applies to (MemAgent: sub_em, em or f1)."""
    shuffle: bool = True
    """Shuffle the trajectories every epoch (by seed and epoch)."""


class SFTOptions(StrictModel):
    batch_size: int = Field(8, ge=1)
    """Trajectories per optimizer step (all their conversations)."""
    micro_batch_size: int = Field(16, ge=1)
    """Conversations per forward/backward; the loss stays the step's exact token mean."""
    turn_kinds: list[str] | None = None
    """Train only on these kinds of turn of each trajectory (MemAgent: memory_update, final;
    e.g. [final]); None: every turn."""


class SFTConfig(AgentSection):
    """The agent's section (`AgentSection`) gives the conversations' chunking and prompts
    (and the token limits of the oracle's)."""

    seed: int = Field(0, ge=0, le=2**63 - 1)
    """Seeds the weights' RNG and the data order."""
    model: ModelConfig
    data: SFTDataConfig
    sft: SFTOptions = SFTOptions()
    optim: OptimConfig = OptimConfig(lr=1e-5)
    trainer: TrainerConfig = TrainerConfig(out_dir="runs/sft")
    """test_freq / val_before_train drive `val/nll`; num_logged_trajectories is unused."""

    @model_validator(mode="after")
    def _one_process(self) -> SFTConfig:
        if self.model.strategy != "replicate":
            raise ValueError(
                "memrl sft trains on one process: model.strategy fsdp is for memrl train"
            )
        return self
