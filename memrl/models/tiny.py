"""Tiny random-weight Qwen2 models with a freshly trained BPE tokenizer.

They let tests and the quickstart run the real Hugging Face code paths (AutoModel,
chat templates, generation, training) on a laptop CPU with nothing downloaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The ChatML format used by Qwen models (no default system prompt)."""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

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
]


def _train_tokenizer(corpus: Iterable[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return tok


def build_tiny_tokenizer(corpus: Iterable[str] = (), vocab_size: int = 1024):
    """A byte-level BPE tokenizer (any text encodes) with ChatML special tokens and template."""
    from transformers import PreTrainedTokenizerFast

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
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 1024,
    max_position_embeddings: int = 32768,
    corpus: Iterable[str] = (),
) -> Path:
    """Build and save a random Qwen2 causal LM + tokenizer loadable by AutoModel/AutoTokenizer.

    Deterministic by `seed`: the same arguments give byte-identical weights.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

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
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
