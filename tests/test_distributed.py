"""Training on several processes (torchrun: gloo on CPU; on a machine with 2 GPUs, nccl, one
GPU per rank) against one process on the same questions: the same weights after each
optimizer step, the same logged metrics, resume on a different number of processes, and a
killed rank ending the whole run.

The runs use `tests/dist_train.py`, whose task rolls out each question alone with a seed of
its own, so that one process and two ranks sample exactly the same groups.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TINY_MEMAGENT
import torch
from safetensors.torch import load_file

from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.distributed import Dist
from memrl.distributed import torchrun_command
from memrl.rl.maths.losses import loss_norm
from memrl.rl.trainer.rollout import QuestionStream, TrainState, collect_groups
from memrl.run.metrics import read_metrics
from memrl.run.record import read_record

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "tests" / "dist_train.py"


def env() -> dict[str, str]:
    out = dict(os.environ)
    out.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), out.get("PYTHONPATH")) if p),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return out


def overrides(model_dir: Path, data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    # 3 questions per step, 2 per mini-batch: on 2 ranks (questions 0, 2 on rank 0 and 1 on
    # rank 1) rank 1 holds nothing of the second mini-batch and must still take part. No
    # dynamic sampling: with it, a group whose samples score alike is dropped and refilled on
    # rank 0, and rank 1 could end a step with nothing (no gradient of its own to add).
    return [
        f"model.path={model_dir}",
        f"data.train_file={data_dir / 'train.jsonl'}",
        f"data.val_file={data_dir / 'val.jsonl'}",
        f"trainer.out_dir={out_dir}",
        *TINY_MEMAGENT,
        "rl.reward=context_overlap",
        "rollout.n=2",
        "data.train_batch_size=3",
        "rl.ppo_mini_batch_size=2",
        "rl.dynamic_sampling=false",
        "optim.lr=1e-5",
        "trainer.log_sinks=[jsonl]",
        "trainer.save_freq=1",
        "trainer.test_freq=1",
        "trainer.val_before_train=false",
        "trainer.dist_timeout_s=60",
        # float32 everywhere: on a machine with GPUs these runs train on CUDA (nccl, one GPU
        # per rank), where `auto` would mean bf16 autocast and tolerances of bf16.
        "model.dtype=float32",
        *extra,
    ]


def run_helper(nproc: int, args: list[str]) -> subprocess.CompletedProcess:
    cmd = (
        [sys.executable, str(HELPER), *args]
        if nproc == 1
        else [*torchrun_command(nproc, [])[:-2], str(HELPER), *args]
    )
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step:08d}" / "model" / "model.safetensors")


def assert_same_weights(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < atol, worst


def assert_same_metrics(a: dict, b: dict) -> None:
    keys = {k for k in a if not k.startswith("perf/") and k != "time"}
    assert keys == {k for k in b if not k.startswith("perf/") and k != "time"}
    for k in sorted(keys):
        if k.startswith("rollout/logprob_diff"):
            # Float noise between the engine's and the trainer's log-probs (~1e-5): it depends
            # on how samples are padded together, which differs with the number of ranks.
            assert abs(a[k] - b[k]) < 1e-4, k
            continue
        assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("dist_data")
    save_records_jsonl(make_synthetic_records(16, num_docs=2, seed=0), d / "train.jsonl")
    save_records_jsonl(make_synthetic_records(3, num_docs=2, seed=1), d / "val.jsonl")
    return d


@pytest.fixture(scope="module")
def single(tiny_model_dir, data_dir, tmp_path_factory) -> Path:
    """One process for 2 steps."""
    out = tmp_path_factory.mktemp("dist_single") / "single"
    run_helper(1, overrides(tiny_model_dir, data_dir, out, "trainer.total_steps=2"))
    return out


# The tests of `runs` on one xdist worker (scripts/test.sh: --dist loadgroup): split over two
# workers, each ran the module's runs.
runs_group = pytest.mark.xdist_group("distributed_runs")


@pytest.fixture(scope="module")
def runs(single, tiny_model_dir, data_dir, tmp_path_factory) -> dict[str, Path]:
    """2 ranks for 1 step, then resumed on 1 process to step 2 (and the one-process run)."""
    two = tmp_path_factory.mktemp("dist_runs") / "two"
    run_helper(2, overrides(tiny_model_dir, data_dir, two, "trainer.total_steps=1"))
    first_two = read_metrics(two / "metrics.jsonl")
    run_helper(1, overrides(tiny_model_dir, data_dir, two, "trainer.total_steps=2",
                            "trainer.resume=auto", "trainer.keep_last=2"))
    return {"single": single, "two": two, "two_step1_metrics": first_two}


@runs_group
@pytest.mark.slow
def test_two_ranks_take_the_single_process_step(runs, tiny_model_dir):
    start = load_file(tiny_model_dir / "model.safetensors")
    one = weights(runs["single"], 1)
    moved = max((one[k] - start[k]).abs().max().item() for k in one)
    assert moved > 5e-6  # AdamW moved the weights by about lr
    assert_same_weights(weights(runs["two"], 1), one)
    single_metrics = read_metrics(runs["single"] / "metrics.jsonl")
    (two_metrics,) = runs["two_step1_metrics"]
    assert_same_metrics(two_metrics, single_metrics[0])
    assert two_metrics["train/groups"] == 3.0 and "val/score" in two_metrics


@runs_group
@pytest.mark.slow
def test_two_ranks_log_the_single_process_trajectories(runs):
    """Each rank's trajectory records are gathered on the main rank, in the order one
    process holds them (trainer.log_trajectories: on for this small run)."""
    from memrl.run.trajectory_log import read_step_files

    single, two = read_step_files(runs["single"])[1], read_step_files(runs["two"])[1]
    assert len(two) == 3 * 2
    key = lambda r: (r["id"], r["sample_index"], r["num_conversations"], r["answer"])  # noqa: E731
    assert [key(r) for r in two] == [key(r) for r in single]
    for a, b in zip(two, single, strict=True):
        for k in ("reward", "kl_penalty", "advantage", "logprob_mean", "entropy_mean"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), k
        assert [c["response_tokens"] for c in a["conversations"]] == [
            c["response_tokens"] for c in b["conversations"]]


@runs_group
@pytest.mark.slow
def test_resume_two_ranks_on_one_process(runs):
    assert_same_weights(weights(runs["two"], 2), weights(runs["single"], 2))
    single_metrics = read_metrics(runs["single"] / "metrics.jsonl")
    two_metrics = read_metrics(runs["two"] / "metrics.jsonl")
    assert [r["step"] for r in two_metrics] == [1, 2]
    assert_same_metrics(two_metrics[1], single_metrics[1])


# ---- the same training on Ray Train's workers (memrl[ray]; one local cluster of 2 CPUs)


@pytest.mark.pipeline
@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_two_ray_workers_take_the_single_process_steps(ray_cluster, single, tiny_model_dir,
                                                        data_dir, tmp_path):
    import dist_train

    from memrl.config import load_config
    from memrl.distributed import train_on_ray
    from memrl.recipes.config import TrainConfig

    out = tmp_path / "ray"
    config = load_config(TrainConfig, None, overrides(
        tiny_model_dir, data_dir, out, "trainer.total_steps=2", "trainer.launcher=ray",
        "trainer.ray.num_workers=2"))
    state = train_on_ray(config, dist_train.train_config)
    assert state.step == 2  # rank 0's return value
    for step in (1, 2):
        assert_same_weights(weights(out, step), weights(single, step))
    ray_metrics = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in ray_metrics] == [1, 2]
    for mine, theirs in zip(ray_metrics, read_metrics(single / "metrics.jsonl"), strict=True):
        assert_same_metrics(mine, theirs)


@pytest.mark.pipeline
@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_failing_ray_worker_ends_the_run_with_its_rank_named(ray_cluster, tiny_model_dir,
                                                                data_dir, tmp_path):
    import dist_train

    from memrl.config import load_config
    from memrl.distributed import RankFailedError, train_on_ray
    from memrl.recipes.config import TrainConfig

    config = load_config(TrainConfig, None, overrides(
        tiny_model_dir, data_dir, tmp_path / "run", "trainer.launcher=ray",
        "trainer.ray.num_workers=2", "trainer.dist_timeout_s=600"))
    t0 = time.monotonic()
    with pytest.raises(RankFailedError, match=r"^rank 1 failed: ValueError: rank 1 gave up\b"):
        train_on_ray(config, dist_train.fail_on_rank_1)
    # Rank 0, waiting for rank 1 in a collective, was stopped by Ray, not by the timeout.
    assert time.monotonic() - t0 < 180


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


@pytest.mark.pipeline
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
@pytest.mark.parametrize("strategy", ["replicate", "fsdp"])
def test_a_killed_rank_ends_the_run_with_its_rank_named(tiny_model_dir, data_dir, tmp_path,
                                                        strategy):
    config = tmp_path / "train.yaml"
    config.write_text("trainer:\n  total_steps: 1000\n")
    out = tmp_path / "run"
    args = overrides(tiny_model_dir, data_dir, out, "trainer.save_freq=0", "trainer.test_freq=0",
                     f"model.strategy={strategy}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "memrl", "train", str(config), *args, "--nproc-per-node", "2"],
        env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").is_file() or not read_metrics(out / "metrics.jsonl"):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no training step within 120 s"
            time.sleep(0.5)
        ranks = {p: rank_of(p) for p in descendants(proc.pid)}
        ranks = {p: r for p, r in ranks.items() if r is not None}
        assert sorted(ranks.values()) == [0, 1]
        victim = next(p for p, r in ranks.items() if r == 1)
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert elapsed < 60
    # memrl's one line (the survivor's): the dead rank, and the resume on 2 ranks again; no
    # launcher traceback or failure table after it
    assert "Traceback" not in stderr and "ChildFailedError" not in stderr, stderr[-3000:]
    ours = [x for x in stderr.splitlines() if x.startswith(("error: ", "interrupted"))]
    assert len(ours) == 1 and re.match(r"error: rank 1 \(host .+, pid \d+\) died in step \d+ "
                                       r"\(\w[\w -]*(; waiting for the other ranks)?\): ",
                                       ours[0]), stderr
    assert ours[0].endswith("no checkpoint saved yet; continue with: memrl train "
                            f"{config} {shlex.join(args)} --nproc-per-node 2 --resume"), ours[0]
    time.sleep(1)
    assert not [p for p in ranks if Path(f"/proc/{p}").exists() and rank_of(p) is not None]
    # rank 0 wrote the run record: how the run was launched (its end depends on where
    # torchrun's SIGTERM found rank 0: in Python, or blocked in a collective until SIGKILL)
    record = read_record(out)
    assert (record["world_size"], record["launcher"], record["strategy"]) == (
        2, "torchrun", strategy)
    assert record["status"] in ("running", "interrupted", "error")


# ---- the pieces, at world size 1 (the multi-rank behaviour is covered above)


def test_an_empty_share_adds_zero_to_the_global_divisor():
    # token-mean over [3, 0] tokens on one rank and nothing on another: D = 3, not 3 + 1.
    norms = [loss_norm(torch.tensor([3, 0]), "token-mean"),
             loss_norm(torch.tensor([]), "token-mean")]
    total = sum(n.local_count for n in norms)
    assert [n.local_count for n in norms] == [3.0, 0.0]
    assert norms[1].with_global_count(lambda x: total).divisor == 3.0
    assert norms[1].divisor == 1.0  # alone, an empty batch still divides by 1
    constant = loss_norm(torch.tensor([2]), "seq-mean-token-sum-norm", scale_factor=7.0)
    assert constant.with_global_count(lambda x: 1000.0).divisor == 7.0


def test_collect_groups_records_the_order_of_the_kept_groups():
    from memrl.trajectory import Trajectory

    records = make_synthetic_records(6, num_docs=2, seed=0)
    rewards = {records[0].id: [0.0, 0.0], records[1].id: [0.0, 1.0], records[2].id: [1.0, 0.5]}

    def rollout(batch, seed):
        return [Trajectory(r.id, i, reward=rewards.get(r.id, [0.3, 0.7])[i])
                for r in batch for i in range(2)]

    groups = collect_groups(rollout, QuestionStream(records, 0, False, TrainState()), want=3,
                            dynamic_sampling=True, max_refill_rounds=2, round_seed=lambda r: r,
                            dist=Dist())
    assert groups.group_order == [records[1].id, records[2].id, records[3].id]
    assert groups.rounds == 2


def test_the_launcher_speaks_only_when_no_rank_could():
    from types import SimpleNamespace

    from memrl.distributed.torchrun import exit_code

    def failure(code, local_rank=0, pid=7, at=100):
        names = {-9: "SIGKILL", -15: "SIGTERM", -11: "SIGSEGV"}
        return SimpleNamespace(exitcode=code, local_rank=local_rank, pid=pid, timestamp=at,
                               signal_name=lambda: names[code])

    # rank 1 failed with an error and printed it; torchrun then stopped rank 0, which exited
    # 143 by itself (memrl's SIGTERM handling): rank 1's code, no line
    assert exit_code({0: failure(143, at=101), 1: failure(2, 1)}, reported=True) == (2, None)
    assert exit_code({0: failure(-15, at=101), 1: failure(1, 1)}, reported=False) == (1, None)
    # rank 1 killed from outside, the survivor said so (reported) and was stopped
    assert exit_code({1: failure(-9, 1), 0: failure(143, at=102)}, reported=True) == (137, None)
    # nobody could speak: one line naming the root cause (not the ranks torchrun stopped)
    code, line = exit_code({0: failure(-15, 0, 41, at=100), 1: failure(-11, 1, 42, at=100)},
                           reported=False)
    assert code == 139
    assert line.startswith("error: rank 1 (local rank 1, pid 42) was killed by SIGSEGV ")
    assert "\n" not in line
    # the earliest of two causes
    code, line = exit_code({0: failure(-9, 0, 41, at=105), 1: failure(-9, 1, 42, at=100)},
                           reported=False)
    assert (code, line.split(" (")[0]) == (137, "error: rank 1")


def test_the_commands_options_are_never_taken_for_torchruns():
    from memrl.distributed.torchrun import parse_args

    args = parse_args(["--standalone", "--nproc-per-node=2", "-m", "memrl", "eval", "c.yaml",
                       "--resume", "--nnodes", "3"])
    assert args.training_script == "memrl" and args.nproc_per_node == "2"
    assert args.training_script_args == ["eval", "c.yaml", "--resume", "--nnodes", "3"]


def test_torchrun_command_starts_memrl_on_this_node():
    cmd = torchrun_command(4, ["train", "c.yaml", "--resume"])
    assert cmd[:3] == [sys.executable, "-m", "memrl.distributed.torchrun"]
    assert "--standalone" in cmd and "--nproc-per-node=4" in cmd
    assert cmd[-5:] == ["-m", "memrl", "train", "c.yaml", "--resume"]


def test_bad_timeout_is_a_config_error(tiny_model_dir, data_dir, tmp_path):
    from memrl.config import load_config
    from memrl.errors import MemrlInputError
    from memrl.recipes.config import TrainConfig

    with pytest.raises(MemrlInputError, match="dist_timeout_s"):
        load_config(TrainConfig, None,
                    overrides(tiny_model_dir, data_dir, tmp_path, "trainer.dist_timeout_s=0"))


def test_a_failed_ray_run_is_one_error_naming_the_lowest_failed_rank():
    import pickle

    from memrl.distributed import RankFailedError, rank_error
    from memrl.errors import MemrlInputError, MissingDependencyError

    err = rank_error({3: KeyError("k"), 1: ValueError("bad value\nmore detail"), 2: OSError()})
    assert isinstance(err, RankFailedError) and err.rank == 1
    assert str(err) == ("rank 1 failed: ValueError: bad value (ranks 2, 3 failed too); "
                        "its traceback is in the log above")
    assert str(rank_error({0: RuntimeError()})) == (
        "rank 0 failed: RuntimeError; its traceback is in the log above")
    # Ray brings a rank's exception back pickled; user errors keep their one-line form.
    user = rank_error(pickle.loads(pickle.dumps(
        {1: MemrlInputError("training data not found", location="d.jsonl"), 2: ValueError()})))
    assert isinstance(user, MemrlInputError)
    assert str(user) == "rank 1: d.jsonl: training data not found"
    missing = MissingDependencyError("vllm", "vllm", "rollout.engine vllm")
    extra = rank_error(pickle.loads(pickle.dumps({0: missing})))
    assert str(extra) == (
        "rank 0: rollout.engine vllm needs the 'vllm' package: pip install 'memrl[vllm]'")


def test_ray_launcher_errors_are_one_line(tmp_path, monkeypatch, capsys):
    from memrl.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(f"model:\n  path: {tmp_path}\ndata:\n  train_file: {tmp_path}/d.jsonl\n"
                      f"trainer:\n  out_dir: {tmp_path}/run\n  launcher: ray\n")
    assert main(["train", str(config), "--nproc-per-node", "2"]) == 2
    assert capsys.readouterr().err == (
        "error: --nproc-per-node: starts torchrun, but trainer.launcher is ray: set the number "
        "of ranks with trainer.ray.num_workers\n")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if memrl[ray] were not installed
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trainer.launcher: ray" in err and "memrl[ray]" in err
    monkeypatch.setenv("WORLD_SIZE", "2")  # one rank of torchrun
    assert main(["train", str(config)]) == 2
    assert "error: trainer.launcher: is ray, but this process is already one rank" in (
        capsys.readouterr().err)


def test_a_local_ray_cluster_never_waits_for_gpus_it_lacks(monkeypatch):
    from memrl.distributed.ray import check_local_gpus
    from memrl.errors import MemrlInputError

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_local_gpus(0)
    check_local_gpus(1)
    with pytest.raises(MemrlInputError, match=r"trainer.ray: 2 GPUs asked for .* has 1"):
        check_local_gpus(2)


def test_cuda_process_group_reduces_cpu_numbers_with_gloo(monkeypatch):
    """On GPUs the group has gloo beside nccl: `Dist.all_reduce_sum`/`all_reduce_max` reduce
    CPU tensors (loss-token counts, critic statistics), which an nccl-only group refuses."""
    import torch.distributed as tdist

    from memrl.distributed import destroy_process_group, init_process_group

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("device", index)))
    monkeypatch.setattr(tdist, "is_initialized", lambda: False)
    monkeypatch.setattr(tdist, "init_process_group", lambda **o: calls.append(("group", o)))
    monkeypatch.delenv("LOCAL_RANK", raising=False)

    init_process_group(60, device="cuda", always=True)
    options = dict(calls)["group"]
    assert options["backend"] == "cpu:gloo,cuda:nccl"
    assert ("device", 0) in calls
    calls.clear()
    init_process_group(60, device="cpu", always=True)
    assert dict(calls)["group"]["backend"] == "gloo"
    destroy_process_group()  # forgets the group it believes it joined (none was made)


LEAVE_AFTER_IMPORTS = """
import json, os
import torch
from memrl.distributed import Dist, destroy_process_group, init_process_group
dist = init_process_group(60, device="cpu", always=True)
import transformers.modeling_utils  # what a rank imports once it has joined (a model load)
import torch.distributed.fsdp, torch.distributed.optim  # FSDP2, ZeRO
dist.all_gather({"rank": dist.rank})
torch.distributed.all_reduce(torch.ones(4))
destroy_process_group()
print(json.dumps(sorted(open(f"/proc/self/task/{t}/comm").read().strip()
                        for t in os.listdir("/proc/self/task"))))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_leaving_the_group_ends_its_gloo_threads_whatever_was_imported_after_joining():
    """torch modules imported once the group exists (transformers' model loading imports one)
    bind the group in default arguments; destroy_process_group must still end its gloo
    threads: alive into the interpreter's exit, one of them aborted a rank after its work
    ('terminate called without an active exception', SIGABRT), now and then."""
    done = subprocess.run([sys.executable, "-c", LEAVE_AFTER_IMPORTS], env=env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    threads = json.loads(done.stdout.strip().splitlines()[-1])
    assert threads and not [t for t in threads if "gloo" in t], threads
