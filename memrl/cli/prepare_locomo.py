"""`memrl prepare locomo`: LoCoMo QA pairs as memory-update episodes (+ memory embeddings)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from memrl.cli.app import prepare_app
from memrl.cli.prepare import Keys
from memrl.config import load_command_config
from memrl.data.locomo import (
    CATEGORY_NAMES,
    HELDOUT_CONVERSATIONS,
    SKIPPED_FILE,
    load_locomo,
    precompute_embeddings,
    save_episodes,
    save_skipped,
    split_by_conversation,
    unique_memory_texts,
)
from memrl.data.prepare_config import LocomoPrepare
from memrl.errors import MemrlInputError
from memrl.fileio import check_output_dir

console = Console(soft_wrap=True)


@prepare_app.command("locomo")
def prepare_locomo(
    input: Annotated[Path, typer.Option("--input", "-i", help="LoCoMo JSON (locomo10.json).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for episodes.jsonl etc.")],
    args: Keys = None,
) -> None:
    """Write one memory-update episode per LoCoMo QA pair; skipped pairs go to skipped.jsonl.
    Keys: split (all, train, heldout: conv-48, conv-49, conv-50; docs/protocols.md), embed
    (also embed the initial-memory facts with MiniLM), embed_batch_size."""
    cfg = load_command_config(LocomoPrepare, args)
    split = cfg.split
    check_output_dir(out, location=f"--out {out}")
    start = time.perf_counter()
    episodes, skipped = load_locomo(input)
    if split != "all":
        episodes = split_by_conversation(episodes, split)
        skipped = split_by_conversation(skipped, split)
        if not episodes:
            side = ("held-out conversations (" + ", ".join(HELDOUT_CONVERSATIONS) + ")"
                    if split == "heldout" else "training conversations")
            raise MemrlInputError(f"the file holds no episodes of the {side}",
                                  location=f"--input {input}")
    path = save_episodes(episodes, out)
    skipped_path = save_skipped(skipped, out)

    conversations = len({e.sample_id for e in episodes})
    table = Table(title=f"LoCoMo episodes from {input} (split {split}: "
                  f"{conversations} conversations)")
    table.add_column("category")
    table.add_column("episodes", justify="right")
    counts = Counter(e.category for e in episodes)
    for cat in sorted(counts):
        table.add_row(f"{cat} {CATEGORY_NAMES.get(cat, '')}".strip(), str(counts[cat]))
    table.add_row("total", str(len(episodes)))
    console.print(table)
    n_adv = sum(e.adversarial for e in episodes)
    console.print(f"adversarial (category 5): {n_adv}")
    if episodes:
        turns = sum(len(e.dialogue) for e in episodes) / len(episodes)
        facts = sum(len(e.initial_memory) for e in episodes) / len(episodes)
        console.print(f"per episode: {turns:.1f} dialogue turns, {facts:.1f} initial facts")
    console.print(f"skipped: {len(skipped)} (listed in {out / SKIPPED_FILE})")
    for reason, n in Counter(_reason_kind(s.reason) for s in skipped).most_common():
        console.print(f"  {n} × {reason}")
    size = path.stat().st_size / 1e6
    console.print(f"[green]wrote[/green] {path} ({size:.1f} MB), {skipped_path}")

    if cfg.embed:
        from memrl.memory.embedder import default_embedder

        embedder = default_embedder()
        n_texts = len(unique_memory_texts(episodes))
        t0 = time.perf_counter()
        index = precompute_embeddings(episodes, embedder, out, batch_size=cfg.embed_batch_size)
        console.print(
            f"[green]embedded[/green] {n_texts} unique memory facts with {index.embedder_name} "
            f"(dim {index.dim}) in {time.perf_counter() - t0:.1f} s"
        )
    console.print(f"done in {time.perf_counter() - start:.1f} s")


def _reason_kind(reason: str) -> str:
    """A reason without its per-item detail (`...: ["D"]`), for counting."""
    return reason.split(":", 1)[0]
