"""In-process generation with a Hugging Face causal LM: the default Generator.

A plain decoding loop with a KV cache rather than `model.generate`, because RL needs exact
control over three things `generate` hides: the log-probability of every sampled token
(under the same temperature the sampler used), a seeded RNG that leaves the global one
alone, and stop strings that end one row of a batch without ending the others.

Conventions (see `Generation`):
- `token_ids` are the sampled tokens, with no padding. If the model emits EOS, the EOS
  token is the last id (and has a logprob): the policy chose to stop, and training must
  be able to reinforce that choice. Nothing after EOS is generated (unless
  `params.ignore_eos`: then EOS is an ordinary token and only max_new_tokens or a stop
  string ends a row).
- `logprobs[i]` = log_softmax(logits / temperature)[token_ids[i]]; with temperature 0
  (greedy) the raw logits are used. Top-p filtering only changes which tokens *can* be
  drawn; the logprob is taken before it, as verl / vLLM report them, so it matches a
  teacher-forced forward pass of the same model (what the RL losses recompute).
- A stop string ends its row after the token that completes it. `text` is cut just after
  the first stop string (which is kept); `token_ids` keep that whole last token, whose
  text may reach past the stop string.
- `text` is the decode of `token_ids` without special tokens (EOS never appears in it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from memrl.inference.base import Generation, SamplingParams, batch_params, check_prompts

_STOP_WINDOW_TOKENS_PER_CHAR = 4
"""A character is at most 4 byte-level tokens: how far back to look for a new stop string."""


class HFEngine:
    """Batched sampling from an in-memory Hugging Face causal LM.

    It wraps the module it is given (no copy), so a trainer can generate with the very
    weights it is updating. Prompts are sorted by length and run in left-padded
    micro-batches of at most `generation_batch_size`; results come back in input order.

    Given a module of its own (a full copy of a policy that is sharded over ranks), it
    samples from that, and `sync_weights(policy, step)` copies the policy's weights into it.
    """

    continuous_batching = False
    """Each request is answered alone (no request queue): agents run in lockstep on it."""

    def __init__(self, model: Any, tokenizer: Any, *, generation_batch_size: int = 32,
                 prompt_lookup_tokens: int = 0) -> None:
        if generation_batch_size < 1:
            raise ValueError(
                f"generation_batch_size must be >= 1, got {generation_batch_size}")
        if prompt_lookup_tokens < 0:
            raise ValueError(
                f"prompt_lookup_tokens must be >= 0, got {prompt_lookup_tokens}")
        self.model = model
        self.tokenizer = tokenizer
        self.generation_batch_size = generation_batch_size
        self.prompt_lookup_tokens = prompt_lookup_tokens
        """Greedy generation of a single prompt drafts up to this many tokens from the prompt
        and checks them in one forward pass (prompt-lookup decoding; `_decode_lookup`);
        0: one token per forward pass."""
        self.eos_token_ids = _eos_token_ids(model, tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = min(self.eos_token_ids) if self.eos_token_ids else 0
        self.pad_token_id: int = int(pad)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    # ---- the Engine seam: this engine samples from the very module being trained, or from
    # a copy of it.
    def sync_weights(self, policy: Any, step: int) -> None:
        """Nothing to do when `self.model` is the policy itself; else copy the policy's
        weights into `self.model`, one tensor at a time. A weight sharded over ranks (a
        DTensor, under FSDP) is gathered whole first: a collective, so every rank syncs."""
        if policy is None or _unwrap(policy) is _unwrap(self.model):
            return
        import torch

        mine = self.model.state_dict()
        theirs = policy.state_dict()
        if mine.keys() != theirs.keys():
            diff = sorted(mine.keys() ^ theirs.keys())
            raise ValueError(
                f"HFEngine: the policy's weights differ from the copy's: {diff[:5]}"
            )
        with torch.no_grad():
            for name, value in theirs.items():
                if hasattr(value, "full_tensor"):
                    value = value.to(self.device).full_tensor()
                mine[name].copy_(value)

    def sleep(self) -> None:
        """Nothing to free: the KV cache lives only inside a `generate` call."""

    def wake(self) -> None:
        """Nothing to restore (see `sleep`)."""

    def close(self) -> None:
        """Nothing to release: the engine is the policy (or its copy), freed with it."""

    async def agenerate(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        """One request, answered at once (the in-process engine has no request queue)."""
        return self.generate([prompt], params)[0]

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        """One Generation per prompt, in input order.

        With a seed set, the same prompts, params and `generation_batch_size` give the same
        samples (the seed drives a private torch.Generator; the global RNG is untouched).
        The whole call shares one RNG: per-prompt params must agree on everything but the
        seed, and seed the call with a hash of their seeds (`batch_params`), so a prompt's
        sample depends on the prompts beside it (vLLM seeds each request on its own).
        """
        import torch

        check_prompts(prompts)
        if not prompts:
            return []
        params = batch_params(prompts, params)
        rng = None
        if params.seed is not None:
            rng = torch.Generator(device=self.device)
            rng.manual_seed(params.seed)
        # Longest first: similar lengths share a micro-batch, so little padding.
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), eager():
                for start in range(0, len(order), self.generation_batch_size):
                    chunk = order[start : start + self.generation_batch_size]
                    outs = self._generate_batch([list(prompts[i]) for i in chunk], params, rng)
                    for i, gen in zip(chunk, outs, strict=True):
                        results[i] = gen
        finally:
            self.model.train(was_training)
        return [g for g in results if g is not None]

    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, rng: Any
    ) -> list[Generation]:
        import torch

        device = self.device
        batch, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        # Positions count real tokens only, so a left-padded row sees the same positions
        # as it would alone.
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        next_position = mask.sum(-1, keepdim=True)

        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        if batch == 1 and params.temperature == 0 and self.prompt_lookup_tokens > 0:
            return [self._decode_lookup(prompts[0], params, out)]
        with decode_matmuls(self.model, batch):
            return self._decode(prompts, params, rng, out, mask, next_position)

    def _decode(self, prompts: list[list[int]], params: SamplingParams, rng: Any, out: Any,
                mask: Any, next_position: Any) -> list[Generation]:
        import torch

        device = mask.device
        batch = len(prompts)
        cache = kv_cache(out)  # grows in place with every step below
        cache_argument = kv_cache_argument(self.model)
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        finish: list[str | None] = [None] * batch
        stops = tuple(s for s in params.stop if s)
        stop_window = _STOP_WINDOW_TOKENS_PER_CHAR * max((len(s) for s in stops), default=0)

        for step in range(params.max_new_tokens):
            next_tokens, next_logprobs = _sample(out.logits[:, -1, :], params, rng)
            for row, (tok, lp) in enumerate(
                zip(next_tokens.tolist(), next_logprobs.tolist(), strict=True)
            ):
                if finish[row] is not None:
                    continue
                tokens[row].append(tok)
                logprobs[row].append(lp)
                if (tok in self.eos_token_ids and not params.ignore_eos) or (
                    stops and self._ends_with_stop(tokens[row], stops, stop_window)
                ):
                    finish[row] = "stop"
            if all(f is not None for f in finish) or step == params.max_new_tokens - 1:
                break
            # Finished rows keep being fed (padding) so the batch stays rectangular;
            # their outputs are ignored.
            done = torch.tensor([f is not None for f in finish], device=device)
            feed = torch.where(done, self.pad_token_id, next_tokens).unsqueeze(-1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            out = self.model(
                input_ids=feed,
                attention_mask=mask,
                position_ids=next_position,
                use_cache=True,
                **{cache_argument: cache},
            )
            next_position = next_position + 1

        return [self._generation(tokens[row], logprobs[row], stops, finish[row] or "length")
                for row in range(batch)]

    def _decode_lookup(self, prompt: list[int], params: SamplingParams, out: Any) -> Generation:
        """Greedy decoding of one row with prompt-lookup drafts: the same tokens as `_decode`
        (up to the rounding of a several-token forward pass against a one-token one), in fewer
        forward passes when the reply copies text from the prompt.

        Each step feeds the token just chosen plus a draft (`lookup_draft`: what followed
        the last n-gram's latest earlier occurrence) in one forward pass; the draft's tokens
        are kept while each equals the model's own greedy choice at its position (its logprob
        from that position's logits), the KV cache is cropped to the kept tokens, and the
        logits after the last kept token choose the next token. Kept tokens are checked one by
        one for EOS, stop strings and max_new_tokens, as `_decode` checks them."""
        import torch

        cache, cache_argument = kv_cache(out), kv_cache_argument(self.model)
        device = out.logits.device
        tokens: list[int] = []
        logprobs: list[float] = []
        stops = tuple(s for s in params.stop if s)
        stop_window = _STOP_WINDOW_TOKENS_PER_CHAR * max((len(s) for s in stops), default=0)

        def take(logits: Any, expected: int | None) -> bool | None:
            """Keep the greedy token of `logits` unless it is not `expected`; whether that
            token ended the row (None: not kept)."""
            tok, lp = _sample(logits.unsqueeze(0), params, None)
            if expected is not None and int(tok) != expected:
                return None
            tokens.append(int(tok))
            logprobs.append(float(lp))
            ended = (tokens[-1] in self.eos_token_ids and not params.ignore_eos) or bool(
                stops and self._ends_with_stop(tokens, stops, stop_window))
            return ended

        logits = out.logits[0, -1]
        finish = None
        while finish is None:
            if take(logits, None):
                finish = "stop"
                break
            room = params.max_new_tokens - len(tokens)
            if room == 0:
                break
            context = prompt + tokens
            draft = lookup_draft(context, min(self.prompt_lookup_tokens, room))
            feed = torch.tensor([[tokens[-1], *draft]], device=device)
            cached = len(context) - 1
            with decode_matmuls(self.model, feed.shape[1]):
                out = self.model(
                    input_ids=feed,
                    attention_mask=torch.ones((1, cached + feed.shape[1]), dtype=torch.long,
                                              device=device),
                    position_ids=torch.arange(cached, cached + feed.shape[1],
                                              device=device)[None],
                    use_cache=True,
                    **{cache_argument: cache},
                )
            rows = out.logits[0]
            kept = 0
            for expected in draft:
                ended = take(rows[kept], expected)
                if ended is None:
                    break
                kept += 1
                if ended:
                    finish = "stop"
                    break
            if finish is None and len(draft) > kept:
                cache.crop(kept - len(draft))
            logits = rows[kept]
            if finish is None and len(tokens) >= params.max_new_tokens:
                break
        return self._generation(tokens, logprobs, stops, finish or "length")

    def _generation(self, tokens: list[int], logprobs: list[float], stops: tuple[str, ...],
                    finish: str) -> Generation:
        """The Generation of one row: its text decoded and cut after its first stop string."""
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = first_stop_end(text, stops)
        if cut is not None:
            text = text[:cut]
        return Generation(tokens, logprobs, text, finish)

    def _ends_with_stop(self, ids: list[int], stop: tuple[str, ...], window: int) -> bool:
        """Whether the newest token completed a stop string (only the tail is decoded)."""
        tail = self.tokenizer.decode(ids[-window:], skip_special_tokens=True)
        return any(s in tail for s in stop)


@contextlib.contextmanager
def decode_matmuls(model: Any, rows: int) -> Any:
    """Decoding steps of one row (`rows` == 1) of a bfloat16 model on a CPU without oneDNN:
    torch's own bfloat16 matrix-vector kernel read SmolLM2-135M's weights in 55 ms a token
    where oneDNN took 83 (float32: 72; AMD Zen 4, one thread, docs/lab/benchmarks.md
    2026-11-28). The prefill, a matrix-matrix product, keeps oneDNN (6x faster there), and so
    do batches (unmeasured) and prompt-lookup drafts checked in one pass (`rows` tokens: oneDNN
    is as fast from 3 and faster from 4, slower at 2; docs/lab/benchmarks.md). Nothing changes
    elsewhere."""
    import torch

    weight = next(_unwrap(model).parameters(), None)
    if (rows != 1 or weight is None or weight.device.type != "cpu"
            or weight.dtype != torch.bfloat16 or not torch.backends.mkldnn.enabled):
        yield
        return
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = True


def lookup_draft(ids: Sequence[int], max_tokens: int, max_ngram: int = 3) -> list[int]:
    """Prompt-lookup draft: the `max_tokens` tokens that followed the latest earlier
    occurrence of the last n tokens of `ids`, for the largest n from `max_ngram` down to 1
    that occurs earlier; [] when none does. A copy that reaches the end of `ids` goes on
    copying its own tokens (as LZ77 does), so a repeating tail drafts its next turns.
    (transformers' `prompt_lookup_num_tokens` takes the earliest occurrence; the latest is
    the text being copied now.)"""
    if max_tokens <= 0:
        return []
    ids = list(ids)
    end = len(ids)
    for n in range(min(max_ngram, end - 1), 0, -1):
        tail = ids[end - n:]
        for start in range(end - n - 1, -1, -1):
            if ids[start:start + n] == tail:
                for pos in range(start + n, start + n + max_tokens):
                    ids.append(ids[pos])
                return ids[end:]
    return []


def eager() -> contextlib.AbstractContextManager:
    """Run compiled modules eagerly: generation through the policy whose decoder layers
    are compiled for the update (`model.compile`) would recompile for every layer and new
    KV-cache length until torch gives up. Nothing on torch < 2.6 (no `set_stance`), where
    `model.compile` is refused."""
    import torch

    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance else contextlib.nullcontext()


def kv_cache(output: Any) -> Any:
    """The KV cache a forward pass with `use_cache=True` returned: its `cache` field
    (transformers >= 5.24), `past_key_values` before (reading the old name warns since)."""
    return output["cache"] if "cache" in output else output["past_key_values"]


def kv_cache_argument(model: Any) -> str:
    """The name under which `model`'s forward takes a KV cache: `cache` (transformers >=
    5.24; the old name warns that it goes in 5.40), else `past_key_values`."""
    import inspect

    forward = _unwrap(model).forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def _unwrap(model: Any) -> Any:
    """The base module under a PEFT wrapper (generation and training share its weights)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _sample(logits: Any, params: SamplingParams, rng: Any) -> tuple[Any, Any]:
    """Next token per row and its logprob under softmax(logits / T), taken before top-p."""
    import torch

    logits = logits.float()
    if params.temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
    else:
        logp = torch.log_softmax(logits / params.temperature, dim=-1)
        probs = logp.exp()
        if params.top_p < 1.0:
            probs = top_p_filter(probs, params.top_p)
        tokens = torch.multinomial(probs, 1, generator=rng).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def top_p_filter(probs: Any, top_p: float) -> Any:
    """Zero every token outside the smallest most-likely set whose mass reaches top_p.

    A token is kept when the mass of the tokens ranked above it is still below top_p, so
    the most likely token is always kept. The result is unnormalised (multinomial doesn't
    mind).
    """
    import torch

    sorted_probs, sorted_idx = probs.sort(dim=-1, descending=True)
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_above >= top_p, 0.0)
    return torch.zeros_like(probs).scatter(-1, sorted_idx, sorted_probs)


def first_stop_end(text: str, stop: Sequence[str]) -> int | None:
    """End index of the stop string occurrence that ends first in `text`, if any."""
    ends = [text.find(s) + len(s) for s in stop if s and s in text]
    return min(ends) if ends else None


def _eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """EOS ids from the tokenizer and the model's generation config (Qwen has two)."""
    ids: set[int] = set()
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(int(tok_eos))
    gen_config = getattr(model, "generation_config", None)
    gen_eos = getattr(gen_config, "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos is not None:
        ids.update(int(i) for i in gen_eos)
    return frozenset(ids)



