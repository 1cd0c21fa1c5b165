"""The training / held-out split of LoCoMo's conversations for the MemoryUpdate workflow.

A conversation is on one side by its `sample_id` alone, so the split is the same whatever the
order of the file, and applying it to a file that holds one side already keeps that side
whole: `HELDOUT_CONVERSATIONS` (conv-48, conv-49, conv-50, the last three of `locomo10.json`)
are held out, every other conversation trains. No held-out conversation's session is in
training: the agent's dialogue and initial memory come from its own conversation only.
Why these three (docs/protocols.md): each answerable category's share of the questions is
within 0.8 points of the training side's (held out: 503 answerable questions, training: 1,033).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from memrl.errors import MemrlInputError

HELDOUT_CONVERSATIONS = ("conv-48", "conv-49", "conv-50")
"""LoCoMo sample ids held out of training (evaluation only)."""
SPLITS = ("all", "train", "heldout")


def check_split(split: str, location: str = "--split") -> str:
    """The split's name; unknown names are errors."""
    if split not in SPLITS:
        raise MemrlInputError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}",
                              location=location)
    return split


def conversation_side(sample_id: str) -> str:
    """`heldout` for a held-out conversation, else `train`."""
    return "heldout" if sample_id in HELDOUT_CONVERSATIONS else "train"


def split_conversations(conversation_ids: Iterable[str], split: str) -> list[str]:
    """The distinct ids on `split`'s side (`all`: every one), in order of first appearance."""
    split = check_split(split)
    ids = list(dict.fromkeys(conversation_ids))
    return ids if split == "all" else [i for i in ids if conversation_side(i) == split]


def split_by_conversation(items: Sequence, split: str) -> list:
    """The items (episodes, skip notes: anything with a `sample_id`) on `split`'s side."""
    keep = set(split_conversations((x.sample_id for x in items), split))
    return [x for x in items if x.sample_id in keep]
