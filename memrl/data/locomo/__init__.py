"""LoCoMo (`locomo10.json`) read into episodes for the tool-based memory agent (MemoryUpdate).

`episodes`: the episodes read from the file (one per QA pair), saved and loaded;
`split`: the training / held-out split of the conversations (by sample id);
`embeddings`: the initial memory's embeddings, precomputed once per unique fact text.
"""

from __future__ import annotations

from memrl.data.locomo.episodes import (
    ADVERSARIAL_CATEGORY,
    CATEGORY_NAMES,
    DialogueTurn,
    EPISODES_FILE,
    ID_PATTERN,
    MemoryEpisode,
    MemoryFact,
    SKIPPED_FILE,
    SkipNote,
    build_locomo_episodes,
    episode_id,
    load_episodes,
    load_locomo,
    parse_dia_ids,
    sample_slug,
    save_episodes,
    save_skipped,
)
from memrl.data.locomo.split import (
    HELDOUT_CONVERSATIONS,
    SPLITS,
    check_split,
    conversation_side,
    split_by_conversation,
    split_conversations,
)
from memrl.data.locomo.embeddings import (
    EMBEDDINGS_FILE,
    EmbeddingIndex,
    META_FILE,
    TEXTS_FILE,
    load_embeddings,
    precompute_embeddings,
    unique_memory_texts,
)

__all__ = [
    "ADVERSARIAL_CATEGORY",
    "CATEGORY_NAMES",
    "DialogueTurn",
    "EMBEDDINGS_FILE",
    "EPISODES_FILE",
    "EmbeddingIndex",
    "HELDOUT_CONVERSATIONS",
    "ID_PATTERN",
    "META_FILE",
    "MemoryEpisode",
    "MemoryFact",
    "SKIPPED_FILE",
    "SPLITS",
    "SkipNote",
    "TEXTS_FILE",
    "build_locomo_episodes",
    "check_split",
    "conversation_side",
    "episode_id",
    "load_embeddings",
    "load_episodes",
    "load_locomo",
    "parse_dia_ids",
    "precompute_embeddings",
    "sample_slug",
    "save_episodes",
    "save_skipped",
    "split_by_conversation",
    "split_conversations",
    "unique_memory_texts",
]
