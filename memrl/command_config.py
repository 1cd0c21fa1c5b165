"""The typed configs of the commands that are neither a recipe nor a data generator:
`memrl init-tiny-model`, `init-model`, `view`, `export` and `quickstart`'s own keys. Each is
read from the command's `[CONFIG] [key=value ...]` (`memrl.config.load_command_config`);
docs/configuration.md lists their keys."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from memrl.config import StrictModel


class TinyModelConfig(StrictModel):
    """`memrl init-tiny-model OUT_DIR [key=value ...]`: the random model's shape (the
    arguments of `memrl.models.tiny.build_tiny_model`)."""

    seed: int = 0
    """Seed of the random weights."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (GQA)."""
    intermediate_size: int = 256
    """Width of the MLP."""
    vocab_size: int = 1024
    """Upper bound on the BPE vocabulary trained on the fly."""


class InitModelConfig(StrictModel):
    """`memrl init-model NAME OUT_DIR [key=value ...]`."""

    dtype: str | None = None
    """Weights dtype of a pretrained model on disk: bfloat16 (default: half the size) or
    float32. The dtype it runs in is chosen when it loads (float32 on a CPU without bfloat16
    instructions). The tiny model is always float32."""


class ViewConfig(StrictModel):
    """`memrl view RUN_DIR [--out FILE] [key=value ...]`."""

    steps: list[int] | None = None
    """Training steps whose trajectory records to list, e.g. [10, 20]; default: the last 50
    logged."""


class ExportModelConfig(StrictModel):
    """The model a checkpoint was trained from."""

    path: str | None = None
    """Base model of a LoRA checkpoint (default: model.path of the checkpoint's
    config.yaml)."""


class ExportConfig(StrictModel):
    """`memrl export CHECKPOINT OUT_DIR [key=value ...]`."""

    model: ExportModelConfig = ExportModelConfig()
    """The base model, as training names it."""


class QuickstartSettings(StrictModel):
    """The quickstart's own keys, beside those of its GRPO config."""

    sft_config: Path = Path("configs/quickstart_sft.yaml")
    """The warm start's config (`memrl sft`'s); the quickstart fills in its model, data,
    output directory, seed and agent section."""
    threads: int | None = Field(None, ge=0)
    """torch CPU threads (0: torch's default, one per core); default: QuickstartPlan.threads,
    1, which suits the tiny model on a shared CPU."""


class QuickstartCommand(StrictModel):
    """`memrl quickstart [CONFIG] [key=value ...] [--fresh]`: CONFIG and every key not under
    `quickstart.` are the GRPO config's (`memrl train`'s, default configs/quickstart.yaml);
    these are the quickstart's own."""

    quickstart: QuickstartSettings = QuickstartSettings()
    """The quickstart's own keys."""


COMMAND_CONFIGS: dict[str, type[StrictModel]] = {
    "init-tiny-model": TinyModelConfig, "init-model": InitModelConfig, "view": ViewConfig,
    "export": ExportConfig, "quickstart": QuickstartCommand,
}
"""Each command's config (docs/configuration.md lists their keys)."""
