"""The typed configs of `memrl prepare ...`: one per generator, its settings as keys
(`memrl prepare where-now --out DIR num_docs=[10,40] seed=1`), the defaults defined here once,
unknown keys and bad values one-line errors naming the key. The paths a command reads and
writes stay options of the command (`--input`, `--out`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from memrl.config import StrictModel, located_error
from memrl.data.biographies import DEFAULT_HARD_SHARE, NAME_POOLS
from memrl.data.biographies import WRITE_SPLITS as BIOGRAPHY_SPLITS
from memrl.data.hotpotqa import FORMATS
from memrl.data.locomo import SPLITS as LOCOMO_SPLITS
from memrl.data.ruler_hqa import INCLUDE_MODES, MEMAGENT_SEED, MEMAGENT_SHUFFLE_SEED, STYLES
from memrl.data.state_tracking import DEFAULT_BLOCK_CHARS, DEFAULT_EVAL_DOCS
from memrl.data.state_tracking import WRITE_SPLITS as STATE_SPLITS

BIOGRAPHY_EVAL_DOCS = (16, 32, 64, 128, 256, 512, 1024)
"""`memrl prepare biographies`' evaluation N by default."""


def one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    """A validator: the value must be one of `choices`."""
    def check(value: str) -> str:
        if value not in choices:
            raise PydanticCustomError(
                "choice", f"must be one of {', '.join(choices)}, got {value!r}")
        return value
    return check


def _listed(value: Any) -> Any:
    """`num_docs=50` means `num_docs=[50]`."""
    return [value] if isinstance(value, int) and not isinstance(value, bool) else value


DocCounts = Annotated[list[Annotated[int, Field(ge=1)]], BeforeValidator(_listed),
                      Field(min_length=1)]


class HotpotqaPrepare(StrictModel):
    """`memrl prepare hotpotqa --input SRC --output OUT [key=value ...]`."""

    format: Annotated[str, AfterValidator(one_of(FORMATS))] = "auto"
    """The input's format: auto (from the file), official, ircot, memrl, parquet or hf."""


class FilterConfig(StrictModel):
    """MemAgent's question filter: keep only the questions none of `models` answers without
    context (`memrl prepare ruler-hqa style=memagent`, `memrl prepare memagent-parquet`)."""

    models: list[str] = []
    """Filter models (HF directories or cached hub ids); empty: no filter."""
    samples: int = Field(2, ge=1)
    """Replies per filter model and question (MemAgent: 2)."""
    batch_size: int = Field(64, ge=1)
    """Questions per generate call of the filter."""
    device: str | None = None
    """The filter models' device (default: the best there is)."""
    dtype: str | None = None
    """The filter models' dtype (default: the model's own)."""


class MemagentQuestions(StrictModel):
    """What MemAgent's builder takes: the first `num_questions` questions (after the filter),
    its seeds."""

    num_questions: int | None = Field(None, ge=1)
    """The first K questions (after the filter); default: all. With style memrl: K sampled."""
    shuffle_seed: int = MEMAGENT_SHUFFLE_SEED
    """MemAgent's builder: seed of the one permutation per N."""
    filter: FilterConfig = FilterConfig()
    """MemAgent's filter of questions answered without context."""


class RulerHqaPrepare(MemagentQuestions):
    """`memrl prepare ruler-hqa --input SRC --out DIR num_docs=[50,100] [key=value ...]`:
    eval_{N}.json (MemAgent's RULER-HQA files) from HotpotQA questions."""

    num_docs: DocCounts
    """Documents per context, one file each, e.g. [50, 100, 200]."""
    seed: int = 42
    """Seed of the documents' choice and order."""
    style: Annotated[str, AfterValidator(one_of(STYLES))] = "memrl"
    """memrl: memrl's builder; memagent: MemAgent's published builder (each question's own
    paragraphs + random ones from the whole input pool, one permutation per N)."""
    include: Annotated[str, AfterValidator(one_of(INCLUDE_MODES))] | None = None
    """Style memrl only. gold: gold + other questions' paragraphs (default); all: the
    question's own paragraphs first."""
    index_list_from: int | None = None
    """Style memagent only: files with N at least this store context as pool indices
    (MemAgent: N > 10000); needs the official HotpotQA JSON as input."""

    @model_validator(mode="after")
    def _style_keys(self) -> RulerHqaPrepare:
        if self.style == "memrl":
            for key, given in (("index_list_from", self.index_list_from is not None),
                               ("filter.models", bool(self.filter.models)),
                               ("shuffle_seed", self.shuffle_seed != MEMAGENT_SHUFFLE_SEED)):
                if given:
                    raise located_error(type(self).__name__, key, "only with style=memagent",
                                        getattr(self, key.split(".")[0]))
        elif self.include is not None:
            raise located_error(type(self).__name__, "include", "only with style=memrl "
                                "(MemAgent keeps all of a question's own paragraphs)",
                                self.include)
        return self


class MemagentParquetPrepare(MemagentQuestions):
    """`memrl prepare memagent-parquet --input SRC --output OUT.parquet [key=value ...]`:
    MemAgent's training/validation parquet, built like `prepare ruler-hqa style=memagent`."""

    num_docs: int = Field(200, ge=1)
    """Paragraphs per question (MemAgent: 200)."""
    num_questions: int | None = Field(None, ge=1)
    """The first K questions (after the filter); MemAgent: 8192 for training, 128 for
    validation. Default: all."""
    seed: int = MEMAGENT_SEED
    """Seed of the paragraphs' choice."""


class SyntheticPrepare(StrictModel):
    """`memrl prepare synthetic --out OUT.jsonl [key=value ...]`: deterministic two-hop
    questions over fictional entities (offline data)."""

    num_questions: int = 100
    """Questions to write."""
    num_docs: int = 10
    """Paragraphs per question."""
    seed: int = 0
    """Seed of the entities and questions."""


class SplitFiles(StrictModel):
    """What a generator of train / val / eval_{N} files takes (biographies, the
    state-tracking tasks)."""

    split: str = "all"
    """train: the training and validation files; eval: eval_{N}.json for each num_docs;
    all: both."""
    train_questions: int = 2000
    """Training questions."""
    train_docs: int = 10
    """Documents (filler blocks) per training and validation question."""
    val_questions: int = 64
    """Held-out validation questions (0: no validation file)."""
    eval_questions: int = 128
    """Held-out questions, the same at every N."""
    num_docs: DocCounts = list(DEFAULT_EVAL_DOCS)
    """The N of the evaluation files (documents per evaluation context)."""
    seed: int = 0
    """Seed of everything drawn."""

    @model_validator(mode="after")
    def _eval_keys_need_eval(self) -> SplitFiles:
        if "num_docs" in self.model_fields_set and self.split == "train":
            raise located_error(type(self).__name__, "num_docs", "sets the evaluation files' "
                                "N: not with split=train (use train_docs)", self.num_docs)
        return self


class BiographiesPrepare(SplitFiles):
    """`memrl prepare biographies --out DIR [key=value ...]`: natural sentences, namesake
    distractors, held-out people and sentence forms; train.jsonl, val.jsonl, eval_{N}.json."""

    split: Annotated[str, AfterValidator(one_of(BIOGRAPHY_SPLITS))] = "all"
    """train: train.jsonl + val.jsonl; eval: eval_{N}.json for each num_docs; all: both."""
    train_questions: int = 10_000
    """Training questions."""
    train_docs: int = 16
    """Biographies per training (and validation) question."""
    num_docs: DocCounts = list(BIOGRAPHY_EVAL_DOCS)
    """Biographies per evaluation question, one file each."""
    hard_share: float = DEFAULT_HARD_SHARE
    """Share of distractors sharing the asked person's first or last name."""
    names: Annotated[str, AfterValidator(one_of(NAME_POOLS))] = "distinct"
    """distinct: names from ~1,100 first and last names per split, namesakes only where
    placed; shared: a small pool of each, so first names and surnames recur among many people
    and every context holds namesakes stating the asked attribute."""


class StatePrepare(SplitFiles):
    """`memrl prepare where-now | where-before | who-has | counting | knowledge-update --out
    DIR [key=value ...]`: train.json, val.json (train with data.format: ruler) and
    eval_{N}.json of a state-tracking task."""

    split: Annotated[str, AfterValidator(one_of(STATE_SPLITS))] = "all"
    """train: train.json + val.json; eval: eval_{N}.json for each num_docs; all: both."""
    num_docs: DocCounts = list(DEFAULT_EVAL_DOCS)
    """Filler blocks per evaluation context (N); the default, 1x-64x, is about 1.5K-93K
    tokens of the default filler (1M: 6900)."""
    haystack: str | None = None
    """Filler from this text file (any UTF-8 text, e.g. a book); default: memrl's generated
    biographies."""
    block_chars: int = DEFAULT_BLOCK_CHARS
    """Least characters per filler block (one unit of N)."""


class LocomoPrepare(StrictModel):
    """`memrl prepare locomo --input locomo10.json --out DIR [key=value ...]`: one
    memory-update episode per LoCoMo QA pair."""

    split: Annotated[str, AfterValidator(one_of(LOCOMO_SPLITS))] = "all"
    """Conversations to write: all, train, or heldout (conv-48, conv-49, conv-50;
    docs/protocols.md)."""
    embed: bool = False
    """Also embed the unique initial-memory facts with MiniLM."""
    embed_batch_size: int = Field(128, ge=1)
    """Facts per embedding batch."""


PREPARE_CONFIGS: dict[str, type[StrictModel]] = {
    "hotpotqa": HotpotqaPrepare, "ruler-hqa": RulerHqaPrepare,
    "memagent-parquet": MemagentParquetPrepare, "synthetic": SyntheticPrepare,
    "biographies": BiographiesPrepare, "locomo": LocomoPrepare,
    "where-now | where-before | who-has | counting | knowledge-update": StatePrepare,
}
"""Each `memrl prepare` command's config (docs/configuration.md lists their keys)."""
