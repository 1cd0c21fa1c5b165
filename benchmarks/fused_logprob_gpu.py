"""The response tokens' log-probs through the vocabulary projection, four ways: which to use.

The update's forward ends with log p(label) of every response token under
softmax(h W^T / T) (and the entropy, as a metric). Four implementations, each timed forward +
backward (the update) and forward under no_grad (the old and reference log-prob passes):

- `memrl`: `memrl.rl.maths.losses.linear_logprobs`, memrl's own fused projection (chunks of rows in
  PyTorch, its own backward; no (rows, vocab) tensor kept), timed with the entropy, as the
  update and the old log-prob pass compute it (the others compute none);
- `plain`: h @ W^T, then `memrl.rl.maths.losses.logprobs_from_logits` (the (rows, vocab) logits
  kept for backward; memrl's path when the entropy needs a gradient);
- `liger`: Liger Kernel's fused linear cross-entropy (`reduction="none"`, Triton);
- `cce`: Cut Cross-Entropy's `linear_cross_entropy` (`reduction="none"`, Triton), exact
  (`filter_eps=None`); `cce_filtered`: with its default gradient filter.

Liger and CCE return -log p only (no entropy, no temperature: T is applied by scaling h).
Measured per shape (hidden size, vocabulary), rows (response tokens of one micro-batch) and
precision (`bf16`: bfloat16 h and W, FSDP2's mixed precision; `autocast`: float32 W and h
under bfloat16 autocast, memrl's replicated default): median time of `--repeats` calls, peak
memory above the inputs, the largest error of log p against a float64 reference, and the
relative error of dL/dh and dL/dW against the float32 plain path.

    python benchmarks/fused_logprob_gpu.py --out $OUT/fused.json     # GPU, ~2 min
    python benchmarks/fused_logprob_gpu.py --tiny --out /tmp/f.json   # CPU check (memrl, plain)

Liger and CCE need `pip install liger-kernel cut-cross-entropy` and a CUDA GPU; an
implementation that is not installed or fails is recorded with its one-line error.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import environment, print_environment, run_record, write_summary  # noqa: E402

SHAPES = {"0.5b": (896, 151_936), "3b": (2048, 151_936), "tiny": (32, 512)}
IMPLS = ("memrl", "plain", "liger", "cce", "cce_filtered")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--tiny", action="store_true", help="CPU check: the tiny shape, 64 rows")
    p.add_argument("--shapes", default="0.5b,3b", help=f"comma-separated of {sorted(SHAPES)}")
    p.add_argument("--rows", default="2048,8192", help="response tokens per call, comma-separated")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated of {IMPLS}")
    p.add_argument("--precisions", default="bf16,autocast")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.shapes, args.rows, args.impls = "tiny", "64", "memrl,plain"
    args.shapes = _pick(p, args.shapes, SHAPES, "--shapes")
    args.impls = _pick(p, args.impls, IMPLS, "--impls")
    args.precisions = _pick(p, args.precisions, ("bf16", "autocast"), "--precisions")
    try:
        args.rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        p.error(f"--rows must be comma-separated integers, got {args.rows!r}")
    if min(args.rows) < 1 or args.repeats < 1 or not args.temperature > 0:
        p.error("--rows and --repeats must be >= 1 and --temperature > 0")
    return args


def _pick(p: argparse.ArgumentParser, text: str, allowed: Any, flag: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        p.error(f"{flag}: unknown {bad or text!r}; choose from {sorted(allowed)}")
    return names


def implementation(name: str) -> Any:
    """fn(h, W, labels, T) -> log p per row (float32), differentiable in h and W."""
    import torch

    from memrl.rl.maths.losses import linear_logprobs, logprobs_from_logits

    if name == "memrl":
        return lambda h, w, y, t: linear_logprobs(h, w, y, temperature=t)[0]
    if name == "plain":
        return lambda h, w, y, t: logprobs_from_logits(h @ w.t(), y, temperature=t)
    if name == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return lambda h, w, y, t: -liger_fused_linear_cross_entropy(
            h / t if t != 1.0 else h, w, y, reduction="none").float()
    from cut_cross_entropy import linear_cross_entropy

    eps = None if name == "cce" else "high"

    def cce(h: Any, w: Any, y: Any, t: float) -> Any:
        h = h / t if t != 1.0 else h
        if torch.is_autocast_enabled("cuda"):  # CCE's kernels take one dtype for h and W
            h, w = h.to(torch.bfloat16), w.to(torch.bfloat16)
        return -linear_cross_entropy(h, w, y, reduction="none", filter_eps=eps).float()

    return cce


def package_version(name: str) -> dict[str, str]:
    """{"version": ...} of the package behind implementation `name` (none for memrl's own),
    or {"error": ...} where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    package = {"liger": "liger-kernel", "cce": "cut-cross-entropy",
               "cce_filtered": "cut-cross-entropy"}.get(name)
    if package is None:
        return {}
    try:
        return {"version": version(package)}
    except PackageNotFoundError:
        return {"error": f"not installed: pip install {package}"}


def timed_call(call: Any, leaves: tuple[Any, ...], repeats: int,
               cuda: bool) -> tuple[float, float | None]:
    """The median seconds of `repeats` calls after one warm-up (Triton compiles), and on
    CUDA the peak memory (GiB) above the inputs, gradients of `leaves` cleared each time."""
    import torch

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    times, peak = [], None
    for i in range(repeats + 1):
        for leaf in leaves:  # the peak above the inputs counts the gradients
            leaf.grad = None
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        sync()
        start = time.perf_counter()
        call()
        sync()
        if i:
            times.append(time.perf_counter() - start)
        if cuda:
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    return statistics.median(times), peak


def measure(name: str, hidden: int, vocab: int, rows: int, precision: str,
            args: argparse.Namespace, device: str) -> dict[str, Any]:
    import torch

    from memrl.rl.maths.losses import logprobs_from_logits

    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    h64 = torch.randn(rows, hidden, generator=gen, dtype=torch.float64)
    w64 = torch.randn(vocab, hidden, generator=gen, dtype=torch.float64) * hidden ** -0.5
    y = torch.randint(0, vocab, (rows,), generator=gen).to(device)
    upstream = torch.randn(rows, generator=gen).to(device)
    t = args.temperature
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    h = h64.to(device=device, dtype=dtype).requires_grad_()
    w = w64.to(device=device, dtype=dtype).requires_grad_()
    cuda = device == "cuda"
    ac = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "autocast")
    row: dict[str, Any] = {"impl": name, "hidden": hidden, "vocab": vocab, "rows": rows,
                           "precision": precision, **package_version(name)}
    if "error" in row:
        return row
    try:
        fn = implementation(name)
    except ImportError as e:
        return {**row, "error": f"not installed: {e}"}

    # references: log p in float64 (on the inputs as given), gradients of the float32 plain path
    with torch.no_grad():
        ref_lp = logprobs_from_logits(h.detach().double() @ w.detach().double().t(), y,
                                      temperature=t)
    hr, wr = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    (logprobs_from_logits(hr @ wr.t(), y, temperature=t) * upstream).sum().backward()
    ref_gh, ref_gw = hr.grad, wr.grad
    del hr, wr

    def train_call() -> Any:
        h.grad = w.grad = None
        with ac:
            lp = fn(h, w, y, t)
        (lp * upstream).sum().backward()
        return lp

    def timed(call: Any) -> tuple[float, float | None]:
        return timed_call(call, (h, w), args.repeats, cuda)

    try:
        lp = train_call()
        row["logp_max_abs_error"] = float((lp.detach().double() - ref_lp).abs().max())
        row["grad_h_rel_error"] = float((h.grad.float() - ref_gh).norm() / ref_gh.norm())
        row["grad_w_rel_error"] = float((w.grad.float() - ref_gw).norm() / ref_gw.norm())
        row["train_s"], row["train_peak_gib"] = timed(train_call)

        def no_grad_call() -> None:
            with torch.no_grad(), ac:
                fn(h, w, y, t)

        row["no_grad_s"], row["no_grad_peak_gib"] = timed(no_grad_call)
    except Exception as e:  # noqa: BLE001 - recorded, the other implementations still run
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if "train_s" in row:
        flops = 6.0 * rows * hidden * vocab  # forward h W^T, backward dL/dh and dL/dW
        row["train_tflops_per_s"] = flops / row["train_s"] / 1e12
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    with run_record(args.out, "fused_logprob_gpu", args):
        return run(args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    env = environment()
    print_environment(env)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows_out = []
    for shape in args.shapes:
        hidden, vocab = SHAPES[shape]
        for rows in args.rows:
            for precision in args.precisions:
                for name in args.impls:
                    row = {"shape": shape, **measure(name, hidden, vocab, rows, precision,
                                                     args, device)}
                    rows_out.append(row)
                    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in row.items()), flush=True)
                    if device == "cuda":
                        torch.cuda.empty_cache()
    summary = {"benchmark": "fused_logprob_gpu", "environment": env, "device": device,
               "temperature": args.temperature, "repeats": args.repeats, "rows": rows_out}
    write_summary(summary, args.out)
    return summary


if __name__ == "__main__":
    main()
