from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from collections import namedtuple

import numpy as np
import pytest
import torch

from memrl.cli import main
from memrl.errors import MemrlInputError
from memrl.run.checkpoint import (
    export_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from memrl.run.checkpoint import save as ckpt_save


def _model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _train_step(model, optimizer, scheduler, seed=0):
    """One real AdamW step so that the optimizer has per-parameter state to save."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=g)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def _setup(path):
    model = _model(path)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    _train_step(model, opt, sched)
    return model, opt, sched


def _save(root, step, model, opt=None, sched=None, tokenizer=None, keep_last=3, **state):
    return save_checkpoint(
        root,
        step,
        model=model,
        optimizer=opt,
        scheduler=sched,
        tokenizer=tokenizer,
        trainer_state=state,
        config_yaml="seed: 0\nmodel:\n  path: base\n",
        keep_last=keep_last,
    )


def _draws():
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist())


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_save_modify_load_restores_weights_optimizer_scheduler_rng(tmp_path, tiny_model_dir):
    model, opt, sched = _setup(tiny_model_dir)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    opt_state = {
        k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()
    }
    sched_state = dict(sched.state_dict())
    params_before = [id(p) for p in model.parameters()]

    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = _save(tmp_path / "ckpt", 7, model, opt, sched, epoch=1, data_position=5)
    after_save = _draws()

    # Diverge everything: another step, noisy weights, reseeded generators.
    _train_step(model, opt, sched, seed=1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    random.seed(99), np.random.seed(99), torch.manual_seed(99)

    state = load_checkpoint(path, model=model, optimizer=opt, scheduler=sched)

    assert state == {"step": 7, "epoch": 1, "data_position": 5}
    assert [id(p) for p in model.parameters()] == params_before
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    # Tied embeddings stay tied after loading (lm_head is not stored separately).
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    loaded = opt.state_dict()["state"]
    assert loaded.keys() == opt_state.keys()
    for k, s in opt_state.items():
        for n, t in s.items():
            assert torch.equal(loaded[k][n], t), (k, n)
    assert sched.state_dict()["last_epoch"] == sched_state["last_epoch"] == 1
    assert sched.get_last_lr() == sched_state["_last_lr"]
    assert _draws() == after_save
    # The optimizer still drives the live parameters.
    before = model.model.norm.weight.clone()
    _train_step(model, opt, sched, seed=2)
    assert not torch.equal(before, model.model.norm.weight)


def test_layout_latest_and_config(tmp_path, tiny_model_dir, tiny_tokenizer):
    model, opt, sched = _setup(tiny_model_dir)
    path = _save(tmp_path, 12, model, opt, sched, tokenizer=tiny_tokenizer, epoch=0)
    assert path == tmp_path / "step_00000012"
    names = {p.name for p in path.iterdir()}
    assert names == {
        "model", "tokenizer", "optimizer.pt", "scheduler.pt", "rng.pt",
        "trainer_state.json", "config.yaml",
    }
    assert (tmp_path / "latest").read_text() == "step_00000012\n"
    assert json.loads((path / "model" / "memrl_model.json").read_text())["format"] == "full"
    assert (path / "config.yaml").read_text() == "seed: 0\nmodel:\n  path: base\n"
    assert json.loads((path / "trainer_state.json").read_text()) == {"epoch": 0, "step": 12}
    assert latest_checkpoint(tmp_path) == path
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_keep_last_prunes_oldest(tmp_path, tiny_model_dir):
    model = _model(tiny_model_dir)
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, model, keep_last=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["latest", "step_00000003", "step_00000004"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000004"
    # keep_last=1 keeps exactly the newest; re-saving the same step replaces it.
    _save(tmp_path, 4, model, keep_last=1, epoch=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000004"]
    assert json.loads((tmp_path / "step_00000004" / "trainer_state.json").read_text())["epoch"] == 2


def test_leftover_tmp_dir_from_killed_save_is_ignored_and_cleaned(tmp_path, tiny_model_dir):
    model = _model(tiny_model_dir)
    good = _save(tmp_path, 1, model)
    # A save killed after copying most files: a complete-looking temp dir, and `latest`
    # not yet updated (then also lost, to exercise the fallback scan).
    leftover = tmp_path / ".tmp-step_00000002-abc123"
    shutil.copytree(good, leftover)
    assert latest_checkpoint(tmp_path) == good
    (tmp_path / "latest").unlink()
    assert latest_checkpoint(tmp_path) == good
    (tmp_path / "latest").write_text("step_00000009\n")  # names a deleted checkpoint
    assert latest_checkpoint(tmp_path) == good
    assert load_checkpoint(good, model=model)["step"] == 1

    _save(tmp_path, 2, model)
    assert not leftover.exists()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000002"


def test_exception_mid_save_keeps_previous_checkpoint(tmp_path, tiny_model_dir, monkeypatch):
    model = _model(tiny_model_dir)
    good = _save(tmp_path, 1, model)

    def killed(path):
        raise RuntimeError("killed mid-save")

    monkeypatch.setattr(ckpt_save, "_fsync_tree", killed)
    with pytest.raises(RuntimeError, match="killed"):
        _save(tmp_path, 2, model)
    assert (tmp_path / "latest").read_text() == "step_00000001\n"
    assert latest_checkpoint(tmp_path) == good
    assert not (tmp_path / "step_00000002").exists()
    assert load_checkpoint(good, model=model)["step"] == 1


def test_latest_checkpoint_of_missing_or_empty_root(tmp_path):
    assert latest_checkpoint(tmp_path / "nope") is None
    assert latest_checkpoint(tmp_path) is None


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_model_dir):
    model, opt, sched = _setup(tiny_model_dir)
    return _save(tmp_path_factory.mktemp("saved"), 3, model, opt, sched)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: (p / "optimizer.pt").unlink(), "missing optimizer.pt"),
        (lambda p: (p / "scheduler.pt").write_bytes(b"garbage"), "corrupt checkpoint file"),
        (lambda p: (p / "trainer_state.json").write_text("{oops"), "corrupt checkpoint file"),
        (lambda p: (p / "model" / "model.safetensors").write_bytes(b"\0" * 10), "corrupt weights"),
        (lambda p: (p / "model" / "memrl_model.json").unlink(), "missing memrl_model.json"),
        (lambda p: shutil.rmtree(p / "model"), "missing model/"),
    ],
)
def test_load_damaged_checkpoint_names_path_and_file(
    tmp_path, saved, tiny_model_dir, damage, message
):
    path = tmp_path / "c"
    shutil.copytree(saved, path)
    damage(path)
    model, opt, sched = _setup(tiny_model_dir)
    with pytest.raises(MemrlInputError, match=message) as err:
        load_checkpoint(path, model=model, optimizer=opt, scheduler=sched)
    assert str(path) in str(err.value)


def test_load_into_mismatched_model_is_an_input_error(tmp_path, saved):
    from memrl.models.tiny import build_tiny_model

    other = _model(build_tiny_model(tmp_path / "wide", hidden_size=32, num_heads=2, num_kv_heads=1))
    with pytest.raises(MemrlInputError, match="do not match the model"):
        load_checkpoint(saved, model=other)
    with pytest.raises(MemrlInputError, match="checkpoint directory not found"):
        load_checkpoint(tmp_path / "missing", model=other)


def test_export_full_model_loads_with_same_logits(tmp_path, tiny_model_dir, tiny_tokenizer):
    from transformers import AutoTokenizer

    model, opt, sched = _setup(tiny_model_dir)
    path = _save(tmp_path / "ckpt", 5, model, opt, sched, tokenizer=tiny_tokenizer)
    out = export_checkpoint(path, tmp_path / "export")
    assert not (out / "memrl_model.json").exists()
    # the run's config beside the model: `memrl ask` / `serve` read its agent settings
    assert (out / "memrl_config.yaml").read_text() == (path / "config.yaml").read_text()
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    assert torch.allclose(_logits(_model(out), ids), _logits(model, ids), atol=1e-6)
    assert AutoTokenizer.from_pretrained(out).encode("memory") == tiny_tokenizer.encode("memory")
    with pytest.raises(MemrlInputError, match="not empty"):
        export_checkpoint(path, out)


def _lora_model(path):
    import peft

    model = peft.get_peft_model(
        _model(path), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():  # lora_B starts at zero; make the adapter change the outputs
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


def test_lora_checkpoint_roundtrip_and_merged_export(tmp_path, tiny_model_dir, tiny_tokenizer):
    model = _lora_model(tiny_model_dir)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    _train_step(model, opt, sched)
    config = f"model:\n  path: {tiny_model_dir}\n"
    path = save_checkpoint(
        tmp_path / "ckpt", 2, model=model, optimizer=opt, scheduler=sched,
        tokenizer=tiny_tokenizer, trainer_state={}, config_yaml=config, keep_last=1,
    )
    assert (path / "model" / "adapter_config.json").is_file()
    assert not (path / "model" / "model.safetensors").exists()  # the adapter only
    marker = json.loads((path / "model" / "memrl_model.json").read_text())
    assert marker == {"format": "lora", "base_model": str(tiny_model_dir)}

    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    expected = _logits(model, ids)
    fresh = _lora_model(tiny_model_dir)  # different random lora_B
    assert not torch.allclose(_logits(fresh, ids), expected)
    load_checkpoint(path, model=fresh)
    assert torch.allclose(_logits(fresh, ids), expected, atol=1e-6)
    with pytest.raises(MemrlInputError, match="LoRA"):
        load_checkpoint(path, model=_model(tiny_model_dir))

    out = export_checkpoint(path, tmp_path / "export")
    assert not (out / "adapter_config.json").exists()
    exported = _model(out)
    merged = model.merge_and_unload()
    # Merging reorders float32 sums: equal up to rounding, not bit for bit.
    assert torch.allclose(_logits(exported, ids), _logits(merged, ids), atol=1e-6)
    assert torch.allclose(_logits(exported, ids), expected, atol=1e-4)

    # A base path that does not exist here needs model.path=BASE.
    (path / "config.yaml").write_text("model:\n  path: /nowhere/base-model\n")
    with pytest.raises(MemrlInputError, match="model.path=PATH"):
        export_checkpoint(path, tmp_path / "export2")
    out3 = export_checkpoint(path, tmp_path / "export3", base_model_path=str(tiny_model_dir))
    assert torch.allclose(_logits(_model(out3), ids), expected, atol=1e-4)
    # `memrl export CKPT OUT model.path=BASE`: the same, from the command line
    assert main(["export", str(path), str(tmp_path / "export4"),
                 f"model.path={tiny_model_dir}"]) == 0
    assert torch.allclose(_logits(_model(tmp_path / "export4"), ids), expected, atol=1e-4)


def test_resolve_checkpoint_from_run_dir_root_or_checkpoint(tmp_path, saved):
    run = tmp_path / "run"
    shutil.copytree(saved.parent, run / "checkpoints")
    step = run / "checkpoints" / saved.name
    assert resolve_checkpoint(step) == step
    assert resolve_checkpoint(run / "checkpoints") == step
    assert resolve_checkpoint(run) == step
    with pytest.raises(MemrlInputError, match="not a checkpoint"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(MemrlInputError, match="no such"):
        resolve_checkpoint(tmp_path / "nope")


def test_cli_export(tmp_path, saved, capsys):
    run = tmp_path / "run"
    shutil.copytree(saved.parent, run / "checkpoints")
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    assert "full model" in capsys.readouterr().out
    assert (tmp_path / "hf" / "config.json").is_file()
    assert _model(tmp_path / "hf").config.model_type == "qwen2"
    capsys.readouterr()

    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "hf2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert str(tmp_path / "missing") in err
    assert main(["export", str(run), str(tmp_path / "hf3"), "model.pth=x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "model.pth: unknown key" in err and err.count("\n") == 1


# ----------------------------------------------------------------------------- issue 9


def test_checkpoint_gets_the_users_umask_not_0700(tmp_path, tiny_model_dir):
    import os
    import stat

    old = os.umask(0o022)
    try:
        path = _save(tmp_path, 1, _model(tiny_model_dir))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert stat.S_IMODE((path / "model").stat().st_mode) == 0o755
    for f in (path / "model" / "model.safetensors", path / "trainer_state.json",
              path / "optimizer.pt" if (path / "optimizer.pt").exists() else path / "rng.pt"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


@pytest.mark.parametrize(
    ("pointer", "problem"),
    [
        (b"step_00000009\n", "names step_00000009, which is missing or incomplete"),
        (b"\xff\xfe garbage", "is corrupt (not the name of a step_* directory)"),
        (b"../../etc\n", "is corrupt (not the name of a step_* directory)"),
    ],
)
def test_bad_latest_falls_back_to_newest_complete_with_a_warning(
    tmp_path, tiny_model_dir, pointer, problem
):
    model = _model(tiny_model_dir)
    _save(tmp_path, 1, model)
    newest = _save(tmp_path, 2, model)
    (tmp_path / "latest").write_bytes(pointer)
    said: list[str] = []
    assert latest_checkpoint(tmp_path, warn=said.append) == newest
    assert said == [f"{tmp_path / 'latest'} {problem}; using the newest complete checkpoint, "
                    "step_00000002"]
    assert resolve_checkpoint(tmp_path) == newest
    said.clear()
    (tmp_path / "latest").write_text("step_00000002\n")
    assert latest_checkpoint(tmp_path, warn=said.append) == newest and said == []


def test_disk_full_during_save_is_one_input_error_and_keeps_previous(
    tmp_path, tiny_model_dir, monkeypatch
):
    import errno

    model = _model(tiny_model_dir)
    good = _save(tmp_path, 1, model)
    real_save = torch.save

    def full(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(MemrlInputError) as err:
        _save(tmp_path, 2, model)
    monkeypatch.setattr(torch, "save", real_save)
    assert str(err.value) == (
        f"{tmp_path / 'step_00000002'}: cannot save the checkpoint: No space left on device; "
        "the previous checkpoints are intact"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000001"]
    assert latest_checkpoint(tmp_path) == good
    assert load_checkpoint(good, model=model)["step"] == 1


DiskUsage = namedtuple("DiskUsage", "total used free")


def test_a_disk_too_small_for_the_checkpoint_is_the_disk_full_error(
    tmp_path, tiny_model_dir, monkeypatch
):
    """torch.save fills the disk and fails as `RuntimeError ... unexpected pos`; deleting the
    half-written checkpoint frees the space again. Modelled: a disk of 8 MiB holding only the
    files under the checkpoint directory, and a write that stops 10 bytes short of full."""
    model, opt, sched = _setup(tiny_model_dir)
    capacity = 8 << 20
    real_usage = shutil.disk_usage

    def usage(path):
        if not str(path).startswith(str(tmp_path)):
            return real_usage(path)
        used = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
        return DiskUsage(capacity, used, capacity - used)

    def short_write(obj, f, *args, **kwargs):
        room = usage(tmp_path).free - 10
        with open(f, "wb") as out:
            out.write(b"\0" * room)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos "
                           f"{room} vs {room + 1000}")

    monkeypatch.setattr(shutil, "disk_usage", usage)
    monkeypatch.setattr(torch, "save", short_write)
    with pytest.raises(MemrlInputError) as err:
        _save(tmp_path, 1, model, opt, sched)
    assert str(err.value) == (
        f"{tmp_path / 'step_00000001'}: cannot save the checkpoint: no space left on the device "
        f"of {tmp_path} (10 bytes free); the previous checkpoints are intact")
    assert list(tmp_path.iterdir()) == []  # the half-written checkpoint is gone


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="mounts a small tmpfs (root only)")
def test_a_real_full_disk_is_the_disk_full_error(tmp_path, tiny_model_dir):
    model, opt, sched = _setup(tiny_model_dir)
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        with pytest.raises(MemrlInputError, match=(
                rf"^{disk / 'step_00000001'}: cannot save the checkpoint: no space left on the "
                rf"device of {disk} \(\d+ bytes free\); the previous checkpoints are intact$")):
            _save(disk, 1, model, opt, sched)
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)  # even with files open


def test_failed_resave_of_the_same_step_puts_the_old_copy_back(
    tmp_path, tiny_model_dir, monkeypatch
):
    model = _model(tiny_model_dir)
    good = _save(tmp_path, 1, model)
    real_rename = ckpt_save.os.rename

    def rename(src, dst):
        if ".tmp-step_00000001" in str(src) and str(dst) == str(good):
            raise KeyboardInterrupt  # Ctrl-C between moving the old copy aside and the rename
        return real_rename(src, dst)

    monkeypatch.setattr(ckpt_save.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 1, model)
    monkeypatch.setattr(ckpt_save.os, "rename", real_rename)
    assert load_checkpoint(good, model=model)["step"] == 1
    assert latest_checkpoint(tmp_path) == good
