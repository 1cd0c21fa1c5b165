"""Tiny random-weight Qwen2 models with a freshly trained BPE tokenizer.

They let tests and the quickstart run the real Hugging Face code paths (AutoModel,
chat templates, generation, training) on a laptop CPU with nothing downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from memrl.errors import MemrlInputError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The ChatML format used by Qwen models (no default system prompt)."""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

BYTE_ALPHABET_SIZE = 256
"""Byte-level BPE starts from one symbol per byte value, so any text can be encoded."""
MIN_VOCAB_SIZE = BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS)
"""The smallest vocabulary (259): the byte alphabet plus the special tokens, no merges. A
smaller `vocab_size` could not be honoured (the trainer would silently return 259)."""

_BASE_CORPUS = [
    "You are presented with a problem, a section of an article that may contain the answer "
    "to the problem, and a previous memory. Please read the provided section carefully and "
    "update the memory with the new information that helps to answer the problem. Be sure to "
    "retain all relevant details from the previous memory while adding any new, useful "
    "information.",
    "You are presented with a problem and a previous memory. Please answer the problem based "
    "on the previous memory and put the answer in \\boxed{}.",
    "<problem> </problem> <memory> </memory> <section> </section> Updated memory: Your answer:",
    "No previous memory. Document 1: Document 2: Document 10: The answer is \\boxed{Paris}.",
    "<tool_call> </tool_call> <tool_response> </tool_response> memory_insert memory_update "
    "memory_delete memory_search {\"name\": \"memory_insert\", \"arguments\": {\"text\": \"\"}}",
    "Who was born in which city? What is the capital of the country where he was born?",
    "was born in is the capital of is located in works as founded the river flows through",
    "the a an of in on at to for with and or but is was are were be been has have had",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 2023 2024 January February March April May June July "
    "August September October November December Monday Tuesday",
    "Wednesday Thursday Friday Saturday Sunday yes no who what when where which why how many "
    "much first second third last year years city country state river mountain university "
    "film album song band actor actress singer writer author director player team club "
    "president king queen war battle company born died married son daughter father mother "
    "American British French German English Italian Spanish Chinese Japanese Indian",
    "Question: Answer: Memory: Document Title: Passage: The following text is a section of "
    "the article. He She It They We I you his her its their our my your this that these those",
]


QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2's pre-tokenizer split (one digit per token, words with their leading space)."""


def _train_tokenizer(corpus: Iterable[str], vocab_size: int):
    """Train a BPE with exactly the normalizer / pre-tokenizer / decoder of Qwen2Tokenizer.

    transformers >= 5 always loads a `qwen2` checkpoint's tokenizer as Qwen2Tokenizer, which
    rebuilds these components from its own code; matching them here means the tokenizer we
    train, the one we save and the one AutoTokenizer loads all split text the same way.
    Like real Qwen tokenizers it applies NFC, so round trips are exact for NFC text.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return tok


def check_vocab_size(vocab_size: int) -> None:
    """MemrlInputError unless `vocab_size` holds the byte alphabet and the special tokens."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise MemrlInputError(f"vocab_size must be an integer, got {vocab_size!r}")
    if vocab_size < MIN_VOCAB_SIZE:
        raise MemrlInputError(
            f"vocab_size must be at least {MIN_VOCAB_SIZE} ({BYTE_ALPHABET_SIZE} byte symbols + "
            f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size}"
        )


def build_tiny_tokenizer(corpus: Iterable[str] = (), vocab_size: int = 1024):
    """A byte-level BPE tokenizer (any text encodes) with ChatML special tokens and template.

    `vocab_size` is an upper bound of at least `MIN_VOCAB_SIZE` (259).
    """
    from transformers import PreTrainedTokenizerFast

    check_vocab_size(vocab_size)

    raw = _train_tokenizer([*_BASE_CORPUS, *corpus], vocab_size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vocab_size: int = 1024,
    max_position_embeddings: int = 32768,
    initializer_range: float = 0.2,
    corpus: Iterable[str] = (),
) -> Path:
    """Build and save a random Qwen2 causal LM + tokenizer loadable by AutoModel/AutoTokenizer.

    The defaults give about 0.4M parameters (generation and a training step take
    milliseconds on a CPU). `vocab_size` is an upper bound, at least `MIN_VOCAB_SIZE` (259):
    BPE training stops early when the corpus has no more pairs to merge, and the model's
    vocabulary is the tokenizer's length. `initializer_range` is ten times Hugging Face's
    0.02: with 0.02 an untrained model's greedy output only repeats the prompt's last token,
    with 0.2 it depends on the whole prompt, which gives generation and training tests
    something to see.
    Deterministic by `seed` (the same arguments give byte-identical files); the global torch
    RNG is left as it was.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _check_shape(hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size)
    check_vocab_size(vocab_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(corpus, vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def count_parameters(model_dir: str | Path) -> int:
    """Number of parameters stored in a saved model's safetensors files, read from headers.

    Tied embeddings are stored (and counted) once, as `model.parameters()` counts them.
    """
    from safetensors import safe_open

    total = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                total += math.prod(f.get_slice(name).get_shape())
    return total


def _check_shape(
    hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int, intermediate_size: int
) -> None:
    for name, value in [
        ("hidden_size", hidden_size),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("num_kv_heads", num_kv_heads),
        ("intermediate_size", intermediate_size),
    ]:
        if value < 1:
            raise MemrlInputError(f"{name} must be >= 1, got {value}")
    if hidden_size % num_heads or (hidden_size // num_heads) % 2:
        raise MemrlInputError(
            f"hidden_size ({hidden_size}) must be num_heads ({num_heads}) times an even "
            "head dimension (rotary embeddings rotate pairs of dimensions)"
        )
    if num_heads % num_kv_heads:
        raise MemrlInputError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
