"""Evaluation as a recipe: an agent x benchmarks run described by one typed config
(`EvalConfig`, read by `memrl eval CONFIG [key.path=value ...]` or built in Python) and run
by the one evaluation runner (`memrl.eval.benchmark.evaluate_suite`).

The config uses training's names for every setting it shares with training: `model.path`,
`model.dtype`, `model.device`, `seed`, `agent` (also `long-context`: the whole document in
one prompt) and the agent's section, and the engine under
`rollout.*` (`rollout.engine`, `rollout.openai.base_urls`, `rollout.vllm.*`, `rollout.n`,
`rollout.temperature`, `rollout.top_p`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from memrl.config import StrictModel
from memrl.recipes.config import AgentSection, RolloutConfig


class EvalModelConfig(StrictModel):
    """The model evaluated (training's `model.*` names)."""

    path: str
    """HF model directory of the policy (e.g. a training run's exported checkpoint)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    """Model dtype; None: bfloat16 on CUDA, float32 on a CPU (numbers do not depend on the
    CPU)."""
    device: str | None = None
    """torch device of the hf engine, e.g. cuda, cpu; None: CUDA when present."""


class EvalRolloutConfig(RolloutConfig):
    """Training's `rollout` section (engine and sampling), one trajectory per record by
    default."""

    n: int = Field(1, ge=1)
    """Trajectories per record (as rollout.n in training)."""


class BenchmarkEntry(StrictModel):
    """One benchmark of the run and its data."""

    name: str
    """A registered benchmark (ruler-hqa, biographies, where-now, where-before, who-has,
    counting, knowledge-update) or a factory by import path `package.module:attr`."""
    data_dir: str
    """Directory of the benchmark's eval_{N}.json files (`memrl prepare ...`)."""
    num_docs: list[int] | None = None
    """The lengths N to run; None: every file of data_dir."""


class EvalSection(StrictModel):
    """What to run and where the results go."""

    benchmarks: list[BenchmarkEntry] = Field(min_length=1)
    """The benchmarks; several make a suite with a leaderboard (docs/protocols.md)."""
    out_dir: str = "runs/eval"
    """Run directory: one subdirectory per benchmark, leaderboard.md / .json across them."""
    limit: int | None = Field(None, ge=1)
    """Evaluate the first K records of every length; None: all."""
    records_per_run: int = Field(32, ge=1)
    """Records rolled out and saved together (a kill loses at most these)."""


class EvalConfig(AgentSection):
    """`memrl eval CONFIG`: the agent (its section keyed by its name, as in training), the
    model, the engine and the benchmarks."""

    seed: int = Field(0, ge=0, le=2**63 - 1)
    """Seed of every episode (derived per benchmark, length and record); the agent section's
    `seed`, where it has one, wins."""
    model: EvalModelConfig
    rollout: EvalRolloutConfig = EvalRolloutConfig()
    eval: EvalSection

    @model_validator(mode="before")
    @classmethod
    def _agent_alias(cls, data: Any) -> Any:
        """`agent: long-context` (the whole document in one prompt) names its task class."""
        from memrl.eval.benchmark import AGENTS

        if isinstance(data, dict) and isinstance(data.get("agent"), str) \
                and data["agent"] in AGENTS:
            return {**data, "agent": AGENTS[data["agent"]]}
        return data


def sampling_as_rollout(cfg: Any) -> Any:
    """`cfg` whose agent section samples as its `rollout` says where the config (or an
    override) gives `rollout.temperature` / `rollout.top_p`: the evaluation then samples as
    training did. Otherwise the agent section's own sampling (its defaults) is kept."""
    section = cfg.agent_config
    given = {key: getattr(cfg.rollout, key) for key in ("temperature", "top_p")
             if key in cfg.rollout.model_fields_set and key in type(section).model_fields}
    if not given:
        return cfg
    return cfg.model_copy(update={"agent_config": section.model_copy(update=given)})


def eval_seed(cfg: Any) -> int | None:
    """The evaluation's seed: the agent section's, else the config's."""
    section_seed = getattr(cfg.agent_config, "seed", None)
    return section_seed if section_seed is not None else cfg.seed


def benchmarks_of(cfg: EvalConfig) -> dict[str, Any]:
    """{name: Benchmark} of `eval.benchmarks`, every file checked before a model loads."""
    from memrl.errors import MemrlInputError
    from memrl.eval.benchmark import benchmark_of

    benches: dict[str, Any] = {}
    for i, entry in enumerate(cfg.eval.benchmarks):
        if entry.name in benches:
            raise MemrlInputError(f"{entry.name} given twice",
                                  location=f"eval.benchmarks.{i}.name")
        try:
            benches[entry.name] = benchmark_of(entry.name, entry.data_dir, entry.num_docs,
                                               cfg.eval.limit)
        except MemrlInputError as exc:
            if exc.location != "--benchmark":  # a file of the benchmark: located already
                raise
            raise MemrlInputError(exc.message, location=f"eval.benchmarks.{i}.name") from None
    return benches


def load_engine(cfg: EvalConfig) -> Any:
    """The engine of `rollout.engine` for `model.path`: the model in-process (hf, on
    `model.device`), a colocated vLLM engine (`rollout.vllm`) or a server pool
    (`rollout.openai`)."""
    import torch

    from memrl.inference.factory import build_engine
    from memrl.inference.loader import load_pretrained, load_tokenizer, resolve_device

    rollout, path = cfg.rollout, cfg.model.path
    if rollout.engine != "hf":
        engine = build_engine(rollout.engine, load_tokenizer(path), model_path=path,
                              vllm=rollout.vllm, openai=rollout.openai,
                              location="rollout.openai.base_urls")
    else:
        seed = eval_seed(cfg)
        if seed is not None:
            torch.manual_seed(seed)
        model, tokenizer = load_pretrained(path, device=resolve_device(cfg.model.device),
                                           dtype=cfg.model.dtype)
        engine = build_engine("hf", tokenizer, model=model,
                              generation_batch_size=rollout.generation_batch_size)
    engine.name_or_path = path
    return engine


def evaluate(cfg: EvalConfig, *, resume: bool = False, dist: Any = None,
             show_progress: bool = True, engine: Any = None) -> dict[str, Any]:
    """Run the config's agent on its benchmarks into `eval.out_dir` (a directory per
    benchmark and the leaderboard); returns each benchmark's results. `engine`: one already
    loaded (default: `load_engine(cfg)`, closed at the end)."""
    from memrl.eval.benchmark import evaluate_suite
    from memrl.eval.report import run_header
    from memrl.tasks import build_task

    cfg = sampling_as_rollout(cfg)
    task = build_task(cfg)
    benches = benchmarks_of(cfg)
    own = engine is None
    engine = load_engine(cfg) if own else engine
    try:
        return evaluate_suite(
            task, engine, benches, out_dir=cfg.eval.out_dir, seed=eval_seed(cfg), dist=dist,
            header=lambda b: run_header(
                b.name, engine, cfg.model.path, cfg.agent_config, agent=cfg.agent,
                protocol=f"benchmark {b.name}", metric=b.metric,
                data_dir=str(getattr(b, "data_dir", "")), num_docs=b.slices(),
                limit=cfg.eval.limit, num_samples=cfg.rollout.n,
                records_per_run=cfg.eval.records_per_run),
            num_samples=cfg.rollout.n, per_run=cfg.eval.records_per_run, resume=resume,
            show_progress=show_progress)
    finally:
        close = getattr(engine, "close", None) if own else None
        if close is not None:
            close()
