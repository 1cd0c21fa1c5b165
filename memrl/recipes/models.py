"""Building the trained models from a config: the policy (+LoRA), the reference, the engine.

With `model.strategy: fsdp` the policy, the reference and the critic are loaded on the CPU
and sharded over the ranks (`memrl.rl.trainer.sharding.shard`); the in-process engine then generates
from a full copy of the policy of its own (a sharded module cannot generate: see
memrl.rl.trainer.sharding).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from typing import Any

import torch

from memrl.distributed import Dist
from memrl.errors import MemrlInputError, require
from memrl.inference import factory
from memrl.inference.loader import load_model, load_tokenizer, resolve_device
from memrl.models.attention import register as register_varlen
from memrl.models.attention import varlen_available
from memrl.recipes.config import ModelConfig, TrainConfig
from memrl.rl.config import OptimConfig
from memrl.rl.maths.flops import device_peak_flops
from memrl.rl.trainer.actor import (
    Actor,
    Reference,
    build_optimizer,
    mixed_precision,
    policy_hidden_states_error,
    warmup_schedule,
)
from memrl.rl.trainer.critic import Critic, ValueModel
from memrl.rl.trainer.sharding import decoder_layers, shard
from memrl.rl.trainer.values import PolicyValueHead, value_head

log = logging.getLogger(__name__)


def master_dtype(mcfg: ModelConfig) -> torch.dtype:
    """dtype of the stored weights: float32 for `auto` (mixed precision), else as named."""
    return torch.float32 if mcfg.dtype == "auto" else getattr(torch, mcfg.dtype)


def autocast_dtype(mcfg: ModelConfig) -> torch.dtype | None:
    """bfloat16 autocast for `auto` (used on CUDA only), none otherwise."""
    return torch.bfloat16 if mcfg.dtype == "auto" else None


def autocast(mcfg: ModelConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """The mixed precision of `model.dtype: auto` for a forward on `device`: bfloat16
    autocast over the float32 master weights on CUDA (as the RL actor runs), else nothing."""
    return mixed_precision(autocast_dtype(mcfg), device)


def attention(mcfg: ModelConfig) -> dict[str, str]:
    """`from_pretrained` keywords choosing the attention kernel (none: the default)."""
    impl = mcfg.attn_implementation
    if impl == "auto":  # varlen where it runs (16-bit on a CUDA device), else the default
        cuda = resolve_device(mcfg.device).type == "cuda"
        half = mcfg.dtype in ("auto", "bfloat16", "float16")  # auto: bf16 autocast on CUDA
        impl = "varlen" if cuda and half and varlen_available() else None
    if impl == "varlen":  # memrl's own, registered with transformers under its name
        impl = register_varlen()
    return {} if impl is None else {"attn_implementation": impl}


def fsdp_param_dtype(mcfg: ModelConfig) -> torch.dtype | None:
    """dtype of FSDP's gathered weights: bfloat16 when the run is mixed precision (`auto`
    on CUDA), else None (the stored dtype)."""
    cuda = resolve_device(mcfg.device).type == "cuda"
    return torch.bfloat16 if mcfg.dtype == "auto" and cuda else None


def load_trained(mcfg: ModelConfig, *, trainable: bool) -> Any:
    """The weights of `model.path`: on the device (replicate) or sharded (fsdp)."""
    device = resolve_device(mcfg.device)
    fsdp = mcfg.strategy == "fsdp"
    model = load_model(mcfg.path, device="cpu" if fsdp else device, dtype=master_dtype(mcfg),
                       **attention(mcfg))
    if not trainable:
        for p in model.parameters():
            p.requires_grad_(False)
    if trainable and mcfg.gradient_checkpointing:
        checkpoint_layers(model, every_n_layers=mcfg.gradient_checkpointing_every_n_layers,
                          fsdp=fsdp)
    if mcfg.compiles():
        compile_layers(model)
    if fsdp:
        f = mcfg.fsdp
        model = shard(model, device, param_dtype=fsdp_param_dtype(mcfg),
                      cpu_offload=f.cpu_offload, reshard_after_forward=f.reshard_after_forward)
    return model


def checkpoint_layers(model: Any, *, every_n_layers: int, fsdp: bool) -> None:
    """Gradient checkpointing (`model.gradient_checkpointing`) of every decoder layer, or of
    layers 0, n, 2n, ... (`model.gradient_checkpointing_every_n_layers`)."""
    kwargs: dict[str, Any] = {}
    if every_n_layers > 1:
        enable = model.gradient_checkpointing_enable
        if "every_n_layers" not in inspect.signature(enable).parameters:
            import transformers

            raise MemrlInputError(
                f"transformers {transformers.__version__} checkpoints every layer or none: "
                "upgrade to transformers>=5.17",
                location="model.gradient_checkpointing_every_n_layers")
        kwargs["every_n_layers"] = every_n_layers
    # FSDP: non-reentrant, so the recomputed forward runs FSDP's hooks (its all-gathers).
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False} if fsdp else None, **kwargs)
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()


COMPILED_VARIANTS = 64
"""Graphs torch may compile for the decoder layers' forward (torch's recompile limit, 8 by
default). Every layer of a model (and of the reference and the critic) shares one code
object, and each combination of grad mode, train/eval, an attention mask or none, inputs
that require grad or not, and a batch of one row or more gets a graph of its own: a
checkpointed, padded update beside its no-grad log-prob pass reached the default limit on the
tiny model (past it, torch runs the layers eagerly)."""


ATTENTION_OUTSIDE_GRAPHS = frozenset({"flex_attention"})
"""Attention kernels that `compile_layers` keeps out of the decoder layers' graphs (a graph
break at the attention call; the rest of each layer is compiled). They run as without
`model.compile`: transformers' own `torch.compile(flex_attention)` with torch's default
(automatic) dynamic shapes, on the model's BlockMask. Traced into a layer compiled with
dynamic=True, flex_attention was lowered with every size symbolic (lengths, heads, head
size, the BlockMask's block sizes): on an H100 (torch 2.11) the packing probe found packed
samples attending to each other (relative logit error 0.22), and under FSDP inductor failed
to lower it (a symbolic head count in `_use_flex_decoding`); on the CPU (torch 2.13) a
flex_attention compiled with every size dynamic does not build (CppCompileError)."""


def attention_outside_graphs(model: Any) -> None:
    """Make the attention kernel of `model` a graph break for torch.compile when it is one
    of ATTENTION_OUTSIDE_GRAPHS: its entry in transformers' attention registry (which the
    models look up at every call) is wrapped in `torch.compiler.disable`. Outside compiled
    code the wrapper only calls through. Idempotent; the registry is process-wide, so every
    compiled model of this attention kernel gets the graph break."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl not in ATTENTION_OUTSIDE_GRAPHS:
        return
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:  # transformers without an attention registry: nothing to wrap
        return
    function = ALL_ATTENTION_FUNCTIONS[impl]
    if getattr(function, "_memrl_outside_graphs", False):
        return
    import torch._dynamo as dynamo

    # torch.compile(dynamic=True) keeps "every size dynamic" set for as long as a compiled
    # layer runs, its graph breaks included (an enter/exit hook of the compiled function):
    # transformers' torch.compile(flex_attention) would inherit it. Back to the plain path's.
    shapes = {"assume_static_by_default": dynamo.config.assume_static_by_default,
              "automatic_dynamic_shapes": dynamo.config.automatic_dynamic_shapes}

    @functools.wraps(function)
    def attention(*args: Any, **kwargs: Any) -> Any:
        with dynamo.config.patch(shapes):
            return function(*args, **kwargs)

    eager = torch.compiler.disable(attention)
    eager._memrl_outside_graphs = True  # type: ignore[attr-defined]
    ALL_ATTENTION_FUNCTIONS[impl] = eager


def compile_layers(model: Any) -> None:
    """`torch.compile` every decoder layer of `model` in place (`model.compile`), with
    dynamic shapes from the start: with automatic dynamic shapes, the recomputation of a
    checkpointed layer could pick the dynamic graph where its forward had run a static one,
    and the backward failed (pytorch issue 166926). flex_attention stays out of the layers'
    graphs (`attention_outside_graphs`)."""
    if not hasattr(torch.compiler, "set_stance"):
        raise MemrlInputError(
            f"needs torch>=2.6 (this is {torch.__version__}): generation must run the "
            "compiled layers eagerly (torch.compiler.set_stance)", location="model.compile")
    import torch._dynamo as dynamo

    if dynamo.config.disable:
        log.warning("model.compile is on, but torch.compile is disabled "
                    "(TORCH_COMPILE_DISABLE=1 in the environment): the layers run eagerly")
    config = dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), COMPILED_VARIANTS))
    attention_outside_graphs(model)
    for layer in decoder_layers(model):
        layer.compile(dynamic=True)


def load_policy(mcfg: ModelConfig) -> tuple[Any, Any]:
    """(policy in train mode, tokenizer); LoRA adapters wrapped on when enabled."""
    tokenizer = load_tokenizer(mcfg.path)
    model = load_trained(mcfg, trainable=True)
    if mcfg.lora.enabled:
        model = _with_lora(model, mcfg)
    model.train()
    return model, tokenizer


def _with_lora(model: Any, mcfg: ModelConfig) -> Any:
    peft = require("peft", extra="lora", feature="LoRA training")
    targets = mcfg.lora.target_modules
    if targets != "all-linear":
        names = [targets] if isinstance(targets, str) else list(targets)
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [n for n in names if n not in present]
        if missing:
            raise MemrlInputError(
                f"no module of the model is named {', '.join(missing)}",
                location="model.lora.target_modules",
            )
    lora = peft.LoraConfig(
        r=mcfg.lora.r,
        lora_alpha=mcfg.lora.alpha,
        lora_dropout=mcfg.lora.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, lora)


def sharding_kwargs(config: TrainConfig, dist: Dist) -> dict[str, Any]:
    """What Actor and Reference need to know of FSDP: the ranks and the compute device."""
    if config.model.strategy != "fsdp":
        return {}
    return dict(sharded_over=dist, device=resolve_device(config.model.device))


def lr_schedule(optimizer: Any, optim: OptimConfig, total_steps: int) -> Any:
    """`optim`'s learning-rate schedule over a run of `total_steps` training steps."""
    return warmup_schedule(optimizer, optim.warmup_steps, kind=optim.lr_scheduler,
                           total_steps=total_steps, min_lr_ratio=optim.min_lr_ratio)


def build_actor(
    config: TrainConfig, policy: Any, tokenizer: Any, temperature: float, dist: Dist = Dist(),
    *, total_steps: int,
) -> Actor:
    """The trainer of `policy`; `total_steps` (training steps of the run) sizes the cosine
    learning-rate schedule. With critic.value_model policy_head (PPO) it also trains a value
    head on the policy, a second parameter group of its AdamW (critic.optim's lr and weight
    decay), broadcast from the main rank."""
    optimizer = build_optimizer(
        policy,
        lr=config.optim.lr,
        betas=config.optim.betas,
        weight_decay=config.optim.weight_decay,
    )
    head = build_value_head(config, policy)
    if head is not None:  # before the schedule: it scales every group's lr
        optimizer.add_param_group({"params": head.parameters(), "lr": config.critic.optim.lr,
                                   "weight_decay": config.critic.optim.weight_decay})
        dist.broadcast_(head.parameters())  # one head on every rank (a checkpoint may replace it)
    return Actor(
        policy,
        config.rl,
        optimizer=optimizer,
        scheduler=lr_schedule(optimizer, config.optim, total_steps),
        grad_clip=config.optim.grad_clip,
        peak_flops=peak_flops(config, policy),
        pad_id=pad_token_id(tokenizer),
        temperature=temperature,
        autocast_dtype=autocast_dtype(config.model),
        value_head=head,
        **sharding_kwargs(config, dist),
    )


def build_value_head(config: TrainConfig, policy: Any) -> PolicyValueHead | None:
    """A fresh value head on the policy's last hidden state (rl.adv_estimator gae with
    critic.value_model policy_head, else None), on the policy's device in its master dtype."""
    if config.rl.adv_estimator != "gae" or config.critic.value_model != "policy_head":
        return None
    problem = policy_hidden_states_error(policy)
    if problem is not None:
        raise MemrlInputError(problem, location="critic.value_model")
    param = next(policy.parameters())
    head = value_head(int(policy.config.hidden_size), device=param.device,
                      dtype=master_dtype(config.model))
    return PolicyValueHead(head, vf_coef=config.critic.vf_coef,
                           cliprange_value=config.critic.cliprange_value)


def peak_flops(config: TrainConfig, policy: Any) -> float | None:
    """Peak FLOP/s for perf/mfu: trainer.peak_tflops, else the table's for the device."""
    if config.trainer.peak_tflops is not None:
        return config.trainer.peak_tflops * 1e12
    dtype = autocast_dtype(config.model) or master_dtype(config.model)
    return device_peak_flops(next(policy.parameters()).device, dtype)


def build_reference(
    config: TrainConfig, policy: Any, tokenizer: Any, temperature: float, dist: Dist = Dist()
) -> Reference | None:
    """The frozen initial policy when a KL term needs it: the policy with its adapters off
    (LoRA), else a second copy of the initial weights."""
    if not config.rl.needs_reference:
        return None
    kw = dict(
        pad_id=pad_token_id(tokenizer),
        temperature=temperature,
        autocast_dtype=autocast_dtype(config.model),
    )
    if config.model.lora.enabled:
        return Reference(policy, config.rl, adapters_off=True, **kw)
    ref = load_trained(config.model, trainable=False)
    return Reference(ref, config.rl, **kw, **sharding_kwargs(config, dist))


def build_critic(config: TrainConfig, tokenizer: Any, dist: Dist = Dist(), *,
                 total_steps: int) -> Critic | None:
    """PPO's separate value model (rl.adv_estimator=gae with critic.value_model separate,
    else None; a value head on the policy is the actor's: `build_actor`): the body of
    `critic.init`'s
    causal LM (`policy`: model.path) with a fresh value head, its own AdamW and schedule.
    fp32 master weights and the policy's autocast; whole on this process (model.strategy
    replicate), or sharded over `dist`'s ranks as the policy is (fsdp: its mesh, mixed
    precision, CPU offload and resharding; the AdamW state then sharded too)."""
    if config.rl.adv_estimator != "gae" or config.critic.value_model != "separate":
        return None
    ccfg, mcfg = config.critic, config.model
    fsdp = mcfg.strategy == "fsdp"
    device = resolve_device(mcfg.device)
    path = mcfg.path if ccfg.init == "policy" else ccfg.init
    lm = load_model(path, device="cpu" if fsdp else device, dtype=master_dtype(mcfg),
                    **attention(mcfg))
    vocab = len(tokenizer)
    if lm.get_input_embeddings().weight.shape[0] < vocab:
        raise MemrlInputError(
            f"the critic's model has {lm.get_input_embeddings().weight.shape[0]} token "
            f"embeddings, fewer than the policy's tokenizer ({vocab}): it must read the "
            "policy's token ids", location="critic.init")
    if mcfg.gradient_checkpointing:
        checkpoint_layers(lm, every_n_layers=mcfg.gradient_checkpointing_every_n_layers,
                          fsdp=fsdp)
    if mcfg.compiles():
        compile_layers(lm)
    model = ValueModel.from_causal_lm(lm)
    if fsdp:
        f = mcfg.fsdp
        model = shard(model, device, param_dtype=fsdp_param_dtype(mcfg),
                      cpu_offload=f.cpu_offload, reshard_after_forward=f.reshard_after_forward)
    model.train()
    optim = ccfg.optim
    optimizer = build_optimizer(model, lr=optim.lr, betas=optim.betas,
                                weight_decay=optim.weight_decay)
    rl = config.rl
    return Critic(
        model, rl, optimizer=optimizer, scheduler=lr_schedule(optimizer, optim, total_steps),
        grad_clip=optim.grad_clip, cliprange_value=ccfg.cliprange_value,
        pad_id=pad_token_id(tokenizer),
        max_tokens_per_micro_batch=ccfg.max_tokens_per_micro_batch
        or rl.max_tokens_per_micro_batch,
        micro_batch_size=ccfg.micro_batch_size or rl.micro_batch_size,
        autocast_dtype=autocast_dtype(mcfg),
        sharded_over=dist if fsdp else None, compute_device=device if fsdp else None,
    )


def build_engine(config: TrainConfig, policy: Any, tokenizer: Any) -> Any:
    """The rollout engine of `rollout.engine`: the policy module itself (hf), a colocated vLLM
    engine (vllm) or a pool of servers (openai); the recipe syncs the policy into it."""
    rollout = config.rollout
    mcfg = config.model
    if rollout.engine == "hf" and mcfg.strategy == "fsdp":
        # a full copy, synced from the shards every step
        policy = load_model(mcfg.path, device=resolve_device(mcfg.device),
                            dtype=fsdp_param_dtype(mcfg) or master_dtype(mcfg))
    return factory.build_engine(
        rollout.engine, tokenizer, model=policy, model_path=mcfg.path,
        generation_batch_size=rollout.generation_batch_size,
        prompt_lookup_tokens=rollout.prompt_lookup_tokens, vllm=rollout.vllm,
        openai=rollout.openai, training=True, location="rollout.openai.base_urls",
    )


def pad_token_id(tokenizer: Any) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    return int(pad or 0)
