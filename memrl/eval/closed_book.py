"""Which questions a model answers WITHOUT the context: MemAgent's question filter.

MemAgent kept only the questions that neither Qwen2.5-7B nor Qwen2.5-7B-Instruct could answer
from the question alone (taskutils/memory_data/filter.py and filter2.py): each model is asked
`"{question}\\nYour final answer in \\\\boxed{}.\\n"` as one user message, 2 replies at
temperature 1.0, top-p 0.7, at most 512 new tokens; a question is dropped when ANY reply of
any model either earns the training reward (`hotpotqa_verifier.compute_score`, here
`memagent_em`) or contains a gold answer (case-insensitive substring). The first K questions
left, in input order, are kept (128 for evaluation, 8,192 for training).

Our own code, written from a reading of those scripts; any `Generator` works (the CLI loads
an in-process Hugging Face engine, tests use a scripted one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import Field

from memrl.config import StrictModel
from memrl.data.records import QARecord
from memrl.inference.base import Generator, SamplingParams, derive_seed, generate_checked
from memrl.inference.base import response_text
from memrl.inference.chat import encode_chat
from memrl.rewards.memagent import memagent_em


class ClosedBookConfig(StrictModel):
    """How each filter model is asked (defaults: MemAgent's filter.py)."""

    template: str = "{question}\nYour final answer in \\boxed{{}}.\n"
    """The user message; `{question}` is replaced (filter.py `TEMPLATE`)."""
    samples: int = Field(2, ge=1)
    """Replies per model and question (filter.py `n=2`)."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature (filter.py `temperature=1.0`)."""
    top_p: float = Field(0.7, gt=0, le=1)
    """Nucleus threshold (filter.py `top_p=0.7`)."""
    max_new_tokens: int = Field(512, ge=1)
    """New tokens per reply (filter.py `max_completion_tokens=512`)."""
    batch_size: int = Field(64, ge=1)
    """Questions per generate call; the filter stops after the batch that completes K."""
    seed: int = 0
    """Base seed; call b of model m samples with `derive_seed(seed, "closed-book", m, b)`."""


def reply_answers(reply: str, answers: Sequence[str]) -> bool:
    """filter2.py's `any_corr` for one reply: the boxed reward (`memagent_em`) is positive,
    or some gold answer occurs in the reply, both lowercased (filter.py `contains`)."""
    if memagent_em(reply, answers) > 0:
        return True
    low = reply.lower()
    return any(gold.lower() in low for gold in answers)


def answered_without_context(generators: Sequence[Generator], records: Sequence[QARecord],
                             config: ClosedBookConfig | None = None, *,
                             call: int = 0) -> list[bool]:
    """For each record, whether any of `config.samples` replies of any generator answers it
    from the question alone (`reply_answers`). `call` numbers the batch for seeding."""
    config = config or ClosedBookConfig()
    answered = [False] * len(records)
    params = dict(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                  top_p=config.top_p)
    for m, generator in enumerate(generators):
        prompts = [encode_chat(generator.tokenizer, config.template.format(question=r.question))
                   for r in records for _ in range(config.samples)]
        seed = derive_seed(config.seed, "closed-book", m, call)
        generations = generate_checked(generator, prompts, SamplingParams(**params, seed=seed))
        for k, gen in enumerate(generations):
            i = k // config.samples
            if not answered[i]:
                answered[i] = reply_answers(response_text(generator.tokenizer, gen),
                                            records[i].answers)
    return answered


def select_unanswered(generators: Sequence[Generator], records: Sequence[QARecord],
                      num_questions: int | None, config: ClosedBookConfig | None = None,
                      progress: Callable[[int, int], None] | None = None) -> list[int]:
    """Positions of the first `num_questions` records (all when None) that no generator
    answers without context, in input order; fewer when the input runs out.
    `progress(done, kept)` is called after each batch."""
    config = config or ClosedBookConfig()
    kept: list[int] = []
    for call, start in enumerate(range(0, len(records), config.batch_size)):
        if num_questions is not None and len(kept) >= num_questions:
            break
        batch = records[start:start + config.batch_size]
        answered = answered_without_context(generators, batch, config, call=call)
        kept += [start + i for i, hit in enumerate(answered) if not hit]
        if progress is not None:
            progress(start + len(batch), len(kept))
    return kept if num_questions is None else kept[:num_questions]
