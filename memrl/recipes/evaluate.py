"""Evaluation as a recipe: an agent x benchmarks run described by one typed config
(`EvalConfig`, read by `memrl eval [CONFIG] [key.path=value ...]` or built in Python) and run
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
    threads: int | None = Field(None, ge=1)
    """torch's CPU threads for the hf engine; None: torch's (one per core). 1 is far faster
    on a CPU busy with other work."""


class EvalRolloutConfig(RolloutConfig):
    """Training's `rollout` section (engine and sampling), one trajectory per record by
    default."""

    n: int = Field(1, ge=1)
    """Trajectories per record (as rollout.n in training)."""

    @model_validator(mode="after")
    def _servers(self) -> EvalRolloutConfig:
        """Training's check, less `openai.weights_dir`: an evaluation reloads no weights. (Servers
        listed for another engine are kept unused, as in training: a config may list them and
        an override pick another engine.)"""
        if self.engine == "openai" and not self.openai.base_urls:
            raise ValueError("rollout.engine openai needs rollout.openai.base_urls")
        return self


class EvalRewardConfig(StrictModel):
    """Training's `rl.reward`: the reward an evaluation on the task's own records
    (`eval.data`) reports."""

    reward: str | dict[str, float] | None = None
    """A reward of the task, or {name: weight} of several; None: the task's first."""


LOCOMO_KEYS = ("categories", "split", "judge_model")
"""The keys of a benchmark entry only LoCoMo reads."""
RULER_KEYS = ("protocol",)
"""The keys of a benchmark entry only RULER-HQA reads."""


class BenchmarkEntry(StrictModel):
    """One benchmark of the run and its data (also the short form `NAME=DIR`)."""

    name: str
    """A registered benchmark (ruler-hqa, biographies, where-now, where-before, who-has,
    counting, knowledge-update, locomo) or a factory by import path `package.module:attr`."""
    data_dir: str
    """Directory of the benchmark's eval_{N}.json files (`memrl prepare ...`; for locomo the
    `memrl prepare locomo` directory)."""
    num_docs: list[int] | None = None
    """The lengths N to run; None: `eval.num_docs`, else every file of data_dir."""
    pool: str | None = None
    """HotpotQA dev JSON that index-list files (MemAgent's eval_12800 / eval_25600) point
    into."""
    protocol: Literal["memagent-boxed", "memagent"] | None = None
    """ruler-hqa with the memagent agent: score as MemAgent's task does, `memagent` (its
    published evaluation) or `memagent-boxed` (the training format), with the memory
    diagnostics (docs/protocols.md); None: the benchmark's own scores of the answer."""
    categories: list[int] | None = None
    """locomo: the LoCoMo categories (1-5, 5 = adversarial); None: 1-4."""
    split: str | None = None
    """locomo: all, or the train / heldout side of the conversation split (held out:
    conv-48, conv-49, conv-50); None: all."""
    judge_model: str | None = None
    """locomo: model directory (HF format) of the LLM judge (mem0's judge prompt, greedy);
    adds the judge accuracy. The evaluated model itself when it is model.path."""

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        """`NAME=DIR` is {name: NAME, data_dir: DIR}."""
        if isinstance(data, str):
            name, sep, directory = data.partition("=")
            if not sep or not name or not directory:
                raise ValueError(f"{data!r} is not NAME=DIR (e.g. where-now=data/where-now)")
            return {"name": name, "data_dir": directory}
        return data

    @model_validator(mode="after")
    def _keys_of_its_benchmark(self) -> BenchmarkEntry:
        owner = {key: "locomo" for key in LOCOMO_KEYS} | {key: "ruler-hqa" for key in RULER_KEYS}
        for key, benchmark in owner.items():
            if getattr(self, key) is not None and self.name != benchmark:
                raise ValueError(f"{key} is read by the {benchmark} benchmark only, not "
                                 f"{self.name}")
        if self.pool is not None and self.name == "locomo":
            raise ValueError("pool is read by the eval_{N}.json benchmarks, not locomo")
        return self

    def options(self) -> dict[str, Any]:
        """The benchmark-specific settings given (`memrl.eval.benchmark.benchmark_of`)."""
        return {key: getattr(self, key) for key in ("pool", *RULER_KEYS, "categories", "split")
                if getattr(self, key) is not None}


class EvalSection(StrictModel):
    """What to run and where the results go."""

    benchmarks: list[BenchmarkEntry] = []
    """The benchmarks, each {name, data_dir, ...} or NAME=DIR; several make a suite with a
    leaderboard (docs/protocols.md)."""
    data: str | None = None
    """Instead of benchmarks: a file of records the agent's own loader reads (results.json
    with the mean reward and scores, trajectories.jsonl)."""
    data_format: str = "auto"
    """data.format of the agent's loader for `data`."""
    num_docs: list[int] | None = None
    """The lengths N of every benchmark without its own num_docs; None: all its files."""
    out_dir: str = "runs/eval"
    """Run directory: one subdirectory per benchmark, leaderboard.md / .json across them."""
    limit: int | None = Field(None, ge=1)
    """Evaluate the first K records of every length; None: all."""
    records_per_run: int | None = Field(None, ge=1)
    """Records rolled out and saved together (a kill loses at most these); None: 8 for
    RULER-HQA under a protocol (MemAgent's), else 32."""
    data_parallel: int = Field(1, ge=1)
    """Evaluate on N processes of this machine, one engine each (one GPU each on CUDA), the
    episodes shared out, one results directory: memrl starts torchrun on itself."""
    progress: bool = True
    """Show the progress bars."""

    @model_validator(mode="after")
    def _one_source(self) -> EvalSection:
        if (self.data is None) == (not self.benchmarks):
            raise ValueError("give eval.benchmarks (e.g. [ruler-hqa=data/hqa]) or "
                             "eval.data (the agent's own records), one of them")
        return self


class EvalConfig(AgentSection):
    """`memrl eval [CONFIG] [key.path=value ...]`: the agent (its section keyed by its name,
    as in training), the model, the engine and the benchmarks."""

    seed: int = Field(0, ge=0, le=2**63 - 1)
    """Seed of every episode (derived per benchmark, length and record); the agent section's
    `seed`, where it has one, wins."""
    model: EvalModelConfig
    rollout: EvalRolloutConfig = EvalRolloutConfig()
    rl: EvalRewardConfig = EvalRewardConfig()
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


def agent_name(agent: str) -> str:
    """How a run's results name its agent: `long-context` for the whole-document reader (its
    task's import path otherwise), any other agent as the config names it."""
    from memrl.eval.benchmark import AGENTS

    return next((name for name, path in AGENTS.items() if path == agent), agent)


def eval_seed(cfg: Any) -> int | None:
    """The evaluation's seed: the agent section's, else the config's."""
    section_seed = getattr(cfg.agent_config, "seed", None)
    return section_seed if section_seed is not None else cfg.seed


def benchmarks_of(cfg: EvalConfig) -> dict[str, Any]:
    """{name: Benchmark} of `eval.benchmarks`, every file checked before a model loads (a
    judge model's too)."""
    from memrl.errors import MemrlInputError
    from memrl.eval.benchmark import benchmark_of
    from memrl.modelfiles import check_model_dir

    benches: dict[str, Any] = {}
    for i, entry in enumerate(cfg.eval.benchmarks):
        where = f"eval.benchmarks.{i}"
        if entry.name in benches:
            raise MemrlInputError(f"{entry.name} given twice", location=f"{where}.name")
        if entry.judge_model is not None:
            try:
                check_model_dir(Path(entry.judge_model))
            except MemrlInputError as exc:
                raise MemrlInputError(exc.message, location=f"{where}.judge_model "
                                      f"{entry.judge_model}") from None
        try:
            benches[entry.name] = benchmark_of(entry.name, entry.data_dir,
                                               entry.num_docs or cfg.eval.num_docs,
                                               cfg.eval.limit, **entry.options())
        except MemrlInputError as exc:
            if not exc.location.startswith("eval.benchmarks"):  # a file: located already
                raise
            key = exc.location.removeprefix("eval.benchmarks").lstrip(".") or "name"
            raise MemrlInputError(exc.message, location=f"{where}.{key}") from None
    return benches


def load_engine(cfg: EvalConfig, path: str | None = None, engine: str | None = None) -> Any:
    """The engine of `rollout.engine` (or `engine`) for `model.path` (or `path`): the model
    in-process (hf, on `model.device`), a colocated vLLM engine (`rollout.vllm`) or a
    server pool (`rollout.openai`)."""
    import torch

    from memrl.errors import MemrlInputError
    from memrl.inference.factory import build_engine
    from memrl.inference.loader import load_pretrained, load_tokenizer, resolve_device

    rollout, path, kind = cfg.rollout, path or cfg.model.path, engine or cfg.rollout.engine
    if kind != "hf":
        built = build_engine(kind, load_tokenizer(path), model_path=path, vllm=rollout.vllm,
                             openai=rollout.openai, location="rollout.openai.base_urls")
    else:
        if cfg.model.threads is not None:
            torch.set_num_threads(cfg.model.threads)
        seed = eval_seed(cfg)
        if seed is not None:
            torch.manual_seed(seed)
        try:
            device = resolve_device(cfg.model.device)
        except MemrlInputError as exc:
            raise MemrlInputError(exc.message, location="model.device") from None
        model, tokenizer = load_pretrained(path, device=device, dtype=cfg.model.dtype)
        built = build_engine("hf", tokenizer, model=model,
                             generation_batch_size=rollout.generation_batch_size,
                             prompt_lookup_tokens=rollout.prompt_lookup_tokens)
    built.name_or_path = path
    return built


def attach_judges(cfg: EvalConfig, benches: dict[str, Any], engine: Any) -> list[Any]:
    """Give each benchmark entry's `judge_model` to its benchmark (`judge`, `judge_id`): the
    evaluated engine when it is model.path, else the judge loaded on the hf engine. Returns
    the engines loaded here (to close)."""
    loaded = []
    for entry in cfg.eval.benchmarks:
        if entry.judge_model is None:
            continue
        same = Path(entry.judge_model).resolve() == Path(cfg.model.path).resolve()
        judge = engine if same else load_engine(cfg, entry.judge_model, engine="hf")
        if not same:
            loaded.append(judge)
        bench = benches[entry.name]
        bench.judge, bench.judge_id = judge, entry.judge_model
    return loaded


def run_header_of(cfg: EvalConfig, task: Any, engine: Any, bench: Any,
                  per_run: int | None) -> dict[str, Any]:
    """The results.json header of `bench`'s run directory (the config: the task's section as
    it runs, e.g. the long-context reader's window resolved)."""
    from memrl.eval.report import run_header

    return run_header(
        bench.name, engine, cfg.model.path, task.config, agent=agent_name(cfg.agent),
        protocol=getattr(bench, "protocol", None) or f"benchmark {bench.name}",
        metric=bench.metric, data_dir=str(getattr(bench, "data_dir", "")),
        num_docs=bench.slices(), limit=cfg.eval.limit, num_samples=cfg.rollout.n,
        records_per_run=per_run or getattr(bench, "records_per_run", None))


def evaluate(cfg: EvalConfig, *, resume: bool = False, dist: Any = None,
             show_progress: bool = True, engine: Any = None,
             benches: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the config's agent on its benchmarks into `eval.out_dir` (a directory per
    benchmark and the leaderboard; with `eval.data`, on those records: `evaluate_records`);
    returns each benchmark's results. `engine`: one already loaded (default:
    `load_engine(cfg)`, closed at the end); `benches`: `benchmarks_of(cfg)` already
    built."""
    from memrl.eval.benchmark import evaluate_suite
    from memrl.tasks import build_task

    cfg = sampling_as_rollout(cfg)
    task = build_task(cfg)
    if benches is None:
        benches = benchmarks_of(cfg) if cfg.eval.data is None else {}
    records = None if cfg.eval.data is None else task.load(
        cfg.eval.data, cfg.eval.data_format, what="evaluation")[:cfg.eval.limit]
    own = engine is None
    engine = load_engine(cfg) if own else engine
    loaded = [engine] if own else []
    try:
        if records is not None:
            return evaluate_records(cfg, task, engine, records, resume=resume, dist=dist,
                                    show_progress=show_progress)
        loaded += attach_judges(cfg, benches, engine)
        per_run = cfg.eval.records_per_run
        return evaluate_suite(
            task, engine, benches, out_dir=cfg.eval.out_dir, seed=eval_seed(cfg), dist=dist,
            header=lambda b: run_header_of(cfg, task, engine, b, per_run),
            num_samples=cfg.rollout.n, per_run=per_run, resume=resume,
            show_progress=show_progress)
    finally:
        for built in loaded:
            close = getattr(built, "close", None)
            if close is not None:
                close()


def evaluate_records(cfg: EvalConfig, task: Any, engine: Any, records: list[Any], *,
                     resume: bool, dist: Any, show_progress: bool) -> dict[str, Any]:
    """The task on its own records (`eval.data`): trajectories.jsonl, results.json with
    the mean reward and scores, results.md (`memrl.eval.runner.evaluate_task`)."""
    from memrl.eval.report import run_header
    from memrl.eval.runner import evaluate_task

    header = run_header(
        f"agent {agent_name(cfg.agent)}", engine, cfg.model.path, task.config,
        protocol=f"reward {cfg.rl.reward or task.rewards[0]}", agent=agent_name(cfg.agent),
        data=cfg.eval.data, limit=cfg.eval.limit, num_samples=cfg.rollout.n)
    return evaluate_task(task, engine, records, out_dir=cfg.eval.out_dir, header=header,
                         num_samples=cfg.rollout.n, per_run=cfg.eval.records_per_run or 32,
                         seed=eval_seed(cfg), resume=resume, show_progress=show_progress,
                         dist=dist)
