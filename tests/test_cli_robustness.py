"""Issue 9 acceptance: malformed paths, model directories and checkpoints through the CLI.

Every case drives `memrl.cli.main` (a few a real `python -m memrl` process) and asserts:
exit code 2, exactly one line on stderr naming the location, no traceback, nothing written
before lost, and, for output paths, that the check came before any model was loaded.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from memrl.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, args: list[str]) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *needles: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def no_model_loading(monkeypatch):
    """Fail the test if a model's weights are loaded (the checks must come first)."""
    import transformers

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the path was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loaded)


@pytest.fixture
def rh_data(tmp_path) -> Path:
    d = tmp_path / "rh"
    d.mkdir()
    (d / "eval_2.json").write_text(json.dumps([
        {"index": 0, "input": "Where?", "answers": ["Paris"], "num_docs": 2,
         "context": "Document 1:\nA\nParis is here.\n\nDocument 2:\nB\nNothing."}
    ]))
    return d


def train_config(tmp_path: Path, model_dir: Path, out_dir: Path, name: str = "train.yaml"
                 ) -> Path:
    """A 1-step training config of `model_dir` into `out_dir`, with 4 synthetic questions."""
    train_file = None
    if train_file is None:
        train_file = tmp_path / "train.jsonl"
        if not train_file.exists():
            from memrl.data.hotpotqa import save_records_jsonl
            from memrl.data.synthetic import make_synthetic_records

            save_records_jsonl(make_synthetic_records(4, num_docs=2, seed=0), train_file)
    p = tmp_path / name
    p.write_text(
        f"model: {{path: {model_dir}}}\n"
        f"data: {{train_file: {train_file}, train_batch_size: 2}}\n"
        f"trainer: {{out_dir: {out_dir}, total_steps: 1, log_sinks: [jsonl]}}\n"
    )
    return p


# ----------------------------------------------------------------------------- output paths


def _file(path: Path, text: str = "keep me\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def output_cases(tmp_path: Path, model: Path, data: Path) -> dict[str, tuple[list, Path, str]]:
    """name -> (argv, the path that is wrong, its location label)."""
    f = _file(tmp_path / "occupied")
    d = tmp_path / "a_dir.jsonl"
    d.mkdir()
    return {
        "train out_dir is a file": (
            ["train", train_config(tmp_path, model, f)], f, f"trainer.out_dir {f}"),
        "train out_dir below a file": (
            ["train", train_config(tmp_path, model, f / "run", "below.yaml")], f / "run",
            f"trainer.out_dir {f / 'run'}"),
        "eval eval.out_dir is a file": (
            ["eval", f"model.path={model}", f"eval.benchmarks=[ruler-hqa={data}]",
             "eval.num_docs=[2]", f"eval.out_dir={f}"], f, f"eval.out_dir {f}"),
        "export destination is a file": (["export", tmp_path / "run", f], f, str(f)),
        "prepare hotpotqa --output is a directory": (
            ["prepare", "hotpotqa", "--input", tmp_path / "in.json", "--output", d], d,
            f"--output {d}"),
        "prepare synthetic --out is a directory": (
            ["prepare", "synthetic", "--out", d], d, f"--out {d}"),
        "prepare ruler-hqa --out is a file": (
            ["prepare", "ruler-hqa", "--input", tmp_path / "in.json", "num_docs=2",
             "--out", f], f, f"--out {f}"),
        "prepare locomo --out is a file": (
            ["prepare", "locomo", "--input", tmp_path / "in.json", "--out", f], f, f"--out {f}"),
    }


CASE_NAMES = [
    "train out_dir is a file", "train out_dir below a file", "eval eval.out_dir is a file",
    "export destination is a file",
    "prepare hotpotqa --output is a directory", "prepare synthetic --out is a directory",
    "prepare ruler-hqa --out is a file", "prepare locomo --out is a file",
]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_output_path_of_the_wrong_kind(capsys, tmp_path, tiny_model_dir, rh_data,
                                       no_model_loading, case):
    args, path, location = output_cases(tmp_path, tiny_model_dir, rh_data)[case]
    code, _, err = run(capsys, args)
    assert code == 2
    kind = "a directory is needed" if "file" in case else "a file is needed"
    if "below a file" in case:
        kind = "nothing can be created below it"
    one_error_line(err, f"error: {location}: ", kind)
    assert (tmp_path / "occupied").read_text() == "keep me\n"


@pytest.mark.parametrize("case", ["train out_dir is a file", "eval eval.out_dir is a file",
                                  "export destination is a file",
                                  "prepare synthetic --out is a directory"])
@pytest.mark.parametrize("problem", ["unwritable", "disk full", "read-only file system"])
def test_output_path_unwritable_or_full(capsys, tmp_path, tiny_model_dir, rh_data,
                                        no_model_loading, monkeypatch, case, problem):
    args, path, location = output_cases(tmp_path, tiny_model_dir, rh_data)[case]
    # Point the command at a fresh location inside a directory that cannot take it.
    target = tmp_path / "blocked"
    target.mkdir()
    new = target / ("out.jsonl" if "synthetic" in case else "out")
    args = [new if a == path else a.replace(f"={path}", f"={new}") if isinstance(a, str) else a
            for a in args]  # (eval names its directory in an override: key=path)
    if case.startswith("train"):
        args = ["train", train_config(tmp_path, tiny_model_dir, new)]
    location = location.replace(str(path), str(new))
    if problem == "unwritable":  # tests run as root, who may write anywhere: simulate it
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: (
            False if Path(p) == target else real(p, mode, **kw)))
        needle = f"{target} is not writable (permission denied)"
    elif problem == "disk full":
        real_usage = shutil.disk_usage
        monkeypatch.setattr(shutil, "disk_usage", lambda p: (
            real_usage(p)._replace(free=0) if Path(p) == target else real_usage(p)))
        needle = f"no space left on the device of {target} (0 bytes free)"
    else:
        real_mkstemp = tempfile.mkstemp

        def mkstemp(*a, **kw):
            if str(kw.get("dir")) == str(target):
                raise OSError(errno.EROFS, "Read-only file system")
            return real_mkstemp(*a, **kw)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
        needle = f"cannot write in {target}: Read-only file system"
    code, _, err = run(capsys, args)
    assert code == 2
    one_error_line(err, f"error: {location}: {needle}")
    assert list(target.iterdir()) == []


def test_output_checks_in_a_real_process(tmp_path, tiny_model_dir):
    occupied = _file(tmp_path / "occupied")
    cfg = train_config(tmp_path, tiny_model_dir, occupied)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "memrl", "train", str(cfg)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    one_error_line(result.stderr, f"trainer.out_dir {occupied}: is a file")
    assert occupied.read_text() == "keep me\n"


# ----------------------------------------------------------------------------- unreadable inputs


def _deny_reading(monkeypatch, victim: Path) -> None:
    real = Path.read_bytes

    def read_bytes(self):
        if self == victim:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


def test_unreadable_training_data_is_one_line(capsys, tmp_path, tiny_model_dir,
                                              no_model_loading, monkeypatch):
    cfg = train_config(tmp_path, tiny_model_dir, tmp_path / "run")
    _deny_reading(monkeypatch, tmp_path / "train.jsonl")
    code, _, err = run(capsys, ["train", cfg])
    assert code == 2
    one_error_line(err, f"error: {tmp_path / 'train.jsonl'}: cannot read it: Permission denied")


def test_unreadable_prepare_input_is_one_line(capsys, tmp_path, monkeypatch):
    src = _file(tmp_path / "hotpot.json", "[]")
    _deny_reading(monkeypatch, src)
    out = tmp_path / "out.jsonl"
    code, _, err = run(capsys, ["prepare", "hotpotqa", "--input", src, "--output", out])
    assert code == 2
    one_error_line(err, f"error: {src}: cannot read it: Permission denied")
    assert not out.exists()


def test_environment_oserror_anywhere_is_one_line(capsys, tmp_path, monkeypatch):
    """What no check caught (a permission or a full disk deep inside a command) is still one
    line naming the file, exit 2."""
    src = _file(tmp_path / "locomo10.json", "[]")
    victim = tmp_path / "out" / "episodes.jsonl"

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(victim))

    monkeypatch.setattr("memrl.cli.prepare_locomo.load_locomo", full)
    code, _, err = run(capsys, ["prepare", "locomo", "--input", src, "--out", tmp_path / "out"])
    assert code == 2
    one_error_line(err, f"error: {victim}: No space left on device")


# ----------------------------------------------------------------------------- model directories


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


MODEL_DAMAGE = {
    "no tokenizer files": (lambda m: (m / "tokenizer.json").unlink(),
                           "{m}: no tokenizer files"),
    "tokenizer.json not JSON": (lambda m: (m / "tokenizer.json").write_text("{oops"),
                                "{m}/tokenizer.json: tokenizer file is not valid JSON"),
    "tokenizer_config.json not JSON": (
        lambda m: (m / "tokenizer_config.json").write_text("[1,"),
        "{m}/tokenizer_config.json: tokenizer file is not valid JSON"),
    "config.json missing": (lambda m: (m / "config.json").unlink(), "--model {m}: not a Hugging"),
    "config.json not JSON": (lambda m: (m / "config.json").write_text("{oops"),
                             "{m}/config.json: model config is not valid JSON"),
    "config.json not UTF-8": (lambda m: (m / "config.json").write_bytes(b"{\"a\": \"\xff\"}"),
                              "{m}/config.json: model config is not UTF-8"),
    "weights truncated": (lambda m: _truncate(m / "model.safetensors", 4096),
                          "{m}/model.safetensors: truncated weights file"),
    "weights header cut": (lambda m: _truncate(m / "model.safetensors", 5),
                           "{m}/model.safetensors: truncated weights file"),
    "weights header garbage": (
        lambda m: (m / "model.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"x" * 16),
        "{m}/model.safetensors: corrupt weights file"),
    "no weights": (lambda m: (m / "model.safetensors").unlink(),
                   "{m}/model.safetensors: no weights"),
    "shard listed but missing": (
        lambda m: ((m / "model.safetensors").rename(m / "model-00001-of-00002.safetensors"),
                   (m / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
                       "a": "model-00001-of-00002.safetensors",
                       "b": "model-00002-of-00002.safetensors"}}))),
        "{m}/model-00002-of-00002.safetensors: weights file missing"),
}


@pytest.fixture
def broken_model(tmp_path, tiny_model_dir):
    def make(damage: str) -> tuple[Path, str]:
        m = tmp_path / "model"
        shutil.copytree(tiny_model_dir, m)
        fn, needle = MODEL_DAMAGE[damage]
        fn(m)
        return m, needle.format(m=m)

    return make


@pytest.mark.parametrize("damage", list(MODEL_DAMAGE))
def test_broken_model_dir_for_eval(capsys, tmp_path, rh_data, broken_model, damage):
    model, needle = broken_model(damage)
    if damage == "config.json missing":  # located at the file, as for train
        needle = f"{model / 'config.json'}: not a Hugging Face model directory: no config.json"
    code, _, err = run(capsys, ["eval", f"model.path={model}",
                                f"eval.benchmarks=[ruler-hqa={rh_data}]", "eval.num_docs=[2]",
                                f"eval.out_dir={tmp_path / 'eval'}"])
    assert code == 2
    one_error_line(err, "error: " + needle)
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize("damage", ["no tokenizer files", "weights truncated", "no weights",
                                    "config.json not JSON", "config.json missing"])
def test_broken_model_dir_for_train(capsys, tmp_path, broken_model, damage):
    model, needle = broken_model(damage)
    if damage == "config.json missing":  # the loader's words
        needle = f"{model / 'config.json'}: not a Hugging Face model directory: no config.json"
    code, _, err = run(capsys, ["train", train_config(tmp_path, model, tmp_path / "run")])
    assert code == 2
    one_error_line(err, "error: " + needle)


def test_truncated_weights_in_a_real_process(tmp_path, rh_data, broken_model):
    model, needle = broken_model("weights truncated")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "memrl", "eval", f"model.path={model}",
         f"eval.benchmarks=[ruler-hqa={rh_data}]", "eval.num_docs=[2]",
         f"eval.out_dir={tmp_path / 'eval'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    one_error_line(result.stderr, "error: " + needle)


# ----------------------------------------------------------------------------- checkpoints


def test_disk_full_during_a_training_checkpoint(capsys, tmp_path, tiny_model_dir, monkeypatch):
    """The second save of a run hits a full disk: one line, exit 2, step 1 stays the latest."""
    import torch

    cfg = train_config(tmp_path, tiny_model_dir, tmp_path / "run")
    real_save = torch.save
    calls = []

    def save(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) > 3:  # optimizer.pt, scheduler.pt, rng.pt of the first checkpoint
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    code, _, err = run(capsys, ["train", cfg, "trainer.total_steps=2", "trainer.save_freq=1",
                                "rollout.n=2", "memagent.chunk_size=48", "memagent.max_chunks=1",
                                "memagent.max_memory_tokens=4", "memagent.max_final_tokens=4"])
    assert code == 2
    ckpts = tmp_path / "run" / "checkpoints"
    one_error_line(err, f"error: {ckpts / 'step_00000002'}: cannot save the checkpoint: No space "
                   "left on device; the previous checkpoints are intact")
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000001"]
    assert (ckpts / "latest").read_text() == "step_00000001\n"


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A training run directory with two full-model checkpoints (steps 1 and 2)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.run.checkpoint import save_checkpoint

    run_dir = tmp_path_factory.mktemp("full_run")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for step in (1, 2):
        save_checkpoint(run_dir / "checkpoints", step, model=model, optimizer=None,
                        scheduler=None, tokenizer=tokenizer, trainer_state={},
                        config_yaml=f"model:\n  path: {tiny_model_dir}\n", keep_last=2)
    return run_dir


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory, tiny_model_dir) -> Path:
    pytest.importorskip("peft")
    import peft
    from transformers import AutoModelForCausalLM

    from memrl.run.checkpoint import save_checkpoint

    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    return save_checkpoint(tmp_path_factory.mktemp("lora") / "checkpoints", 1, model=model,
                           optimizer=None, scheduler=None, tokenizer=None, trainer_state={},
                           config_yaml=f"model:\n  path: {tiny_model_dir}\n", keep_last=1)


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda m: (m / "adapter_config.json").unlink(),
         "{m}/adapter_config.json: LoRA checkpoint without its adapter_config.json"),
        (lambda m: (m / "adapter_config.json").write_text("{"),
         "{m}/adapter_config.json: adapter config is not valid JSON"),
        (lambda m: (m / "adapter_model.safetensors").unlink(),
         "{m}/adapter_model.safetensors: no weights"),
        (lambda m: _truncate(m / "adapter_model.safetensors", 100),
         "{m}/adapter_model.safetensors: truncated weights file"),
    ],
)
def test_broken_lora_checkpoint_export(capsys, tmp_path, lora_checkpoint, damage, needle):
    ckpt = tmp_path / "step"
    shutil.copytree(lora_checkpoint, ckpt)
    damage(ckpt / "model")
    code, _, err = run(capsys, ["export", ckpt, tmp_path / "hf"])
    assert code == 2
    one_error_line(err, "error: " + needle.format(m=ckpt / "model"))
    assert not (tmp_path / "hf").exists()


def test_truncated_full_checkpoint_export(capsys, tmp_path, full_run):
    ckpt = tmp_path / "step"
    shutil.copytree(full_run / "checkpoints" / "step_00000002", ckpt)
    _truncate(ckpt / "model" / "model.safetensors", 1000)
    code, _, err = run(capsys, ["export", ckpt, tmp_path / "hf"])
    assert code == 2
    one_error_line(err, f"error: {ckpt / 'model' / 'model.safetensors'}: truncated weights")


@pytest.mark.parametrize("pointer", [b"step_00000007\n", b"\x00\xff\x13", b""])
def test_corrupt_latest_falls_back_with_one_warning_line(capsys, tmp_path, full_run, pointer):
    run_dir = tmp_path / "run"
    shutil.copytree(full_run, run_dir)
    (run_dir / "checkpoints" / "latest").write_bytes(pointer)
    code, out, err = run(capsys, ["export", run_dir, tmp_path / "hf"])
    assert code == 0
    newest = run_dir / "checkpoints" / "step_00000002"
    assert err.splitlines() == [
        f"warning: {run_dir / 'checkpoints' / 'latest'} "
        + ("names step_00000007, which is missing or incomplete" if pointer.strip(b"\n")
           .startswith(b"step_") else "is corrupt (not the name of a step_* directory)")
        + "; using the newest complete checkpoint, step_00000002"
    ]
    assert f"exported {newest}" in out
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_a_command_without_a_model_leaves_transformers_unimported_and_quiet():
    # memrl turns Hugging Face's progress bars off; a command that needs no model (here
    # --help) does it without importing transformers (1-2 s), and the bars stay off when
    # transformers comes later.
    code = ("import sys\nfrom memrl.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\nassert 'transformers' not in sys.modules\n"
            "import transformers.utils.logging as hf\nassert not hf.is_progress_bar_enabled()\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
