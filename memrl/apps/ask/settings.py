"""The agent settings a model was trained with, found next to it, with the user's overrides.

memrl keeps a run's whole config with what it writes: every checkpoint holds `config.yaml`
beside its `model/` directory, and `memrl export` copies it next to the exported model as
`memrl_config.yaml`. A model directory is looked at in that order:

    DIR/memrl_config.yaml        a model written by `memrl export` (the quickstart's too)
    DIR/../config.yaml           DIR is the `model/` directory of a checkpoint

and its `memagent` section gives the settings that say how the model learned to read:
`INHERITED` (chunk size, memory and answer lengths, prompts). The rest stays the
evaluation's defaults (`MemAgentConfig`): `max_chunks` none (a document is read whole),
sampling as MemAgent's published evaluation (temperature 0.7, top-p 0.95) rather than the
training rollouts' exploration. A model without a stored config gets those defaults too.
The settings given by the user (`memagent.*` keys of `memrl ask` / `memrl serve`, or `ask()`'s
`config`) win over both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from memrl.agents.memagent import MemAgentConfig
from memrl.config import load_yaml, validate_config
from memrl.errors import MemrlInputError
from memrl.modelfiles import EXPORTED_CONFIG

T = TypeVar("T")

STORED_CONFIG = EXPORTED_CONFIG
"""What `memrl export` writes next to a model: the config of the run that trained it."""
INHERITED = ("chunk_size", "max_memory_tokens", "max_final_tokens", "prompts")
"""The `memagent` settings a model's stored config gives (see the module docstring)."""


@dataclass(frozen=True)
class StoredSettings:
    """What was found next to a model."""

    values: dict[str, Any] = field(default_factory=dict)
    """The INHERITED settings from the stored config (empty without one)."""
    source: Path | None = None
    """The config file they came from."""
    agent: str | None = None
    """The agent the model was trained as (`agent` of the config): memagent or memupdate."""


def stored_config_path(model_dir: str | Path) -> Path | None:
    """The training config stored with `model_dir`, if there is one."""
    from memrl.run.checkpoint import checkpoint_config

    model = Path(model_dir)
    if (model / STORED_CONFIG).is_file():
        return model / STORED_CONFIG
    return checkpoint_config(model)


def stored_settings(model_dir: str | Path | None) -> StoredSettings:
    """The INHERITED memagent settings stored with `model_dir` (none for a model that memrl
    did not train, or a hub id). A stored config that no longer validates is a
    MemrlInputError naming the file and the key."""
    path = stored_config_path(model_dir) if model_dir is not None else None
    if path is None:
        return StoredSettings()
    data = load_yaml(path)
    section = data.get("memagent") or {}
    if not isinstance(section, dict):
        raise MemrlInputError("memagent is not a mapping", location=str(path))
    config = validate_config(MemAgentConfig, section, source=f"{path}: memagent")
    dumped = config.model_dump(mode="json")
    values = {key: dumped[key] for key in INHERITED if key in section}
    agent = data.get("agent")
    return StoredSettings(values, path, agent if isinstance(agent, str) else None)


def agent_config(
    stored: StoredSettings, overrides: dict[str, Any] | None = None
) -> MemAgentConfig:
    """MemAgentConfig defaults, then the stored settings, then `overrides` (None values are
    "not given"). A bad override is a MemrlInputError naming its option."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    try:
        return MemAgentConfig(**{**stored.values, **given})
    except ValueError as exc:
        errors = getattr(exc, "errors", None)
        if callable(errors):
            err = errors()[0]
            key = "memagent." + ".".join(map(str, err["loc"])) if err["loc"] else "memagent"
            raise MemrlInputError(err["msg"], location=key) from None
        raise MemrlInputError(str(exc)) from None


def load_reading_config(model_class: type[T], model: Path, args: list[str] | None, *,
                        command: str, agent_defaults: dict[str, Any] | None = None,
                        warn: Callable[[str], None] | None = None) -> T:
    """The config of `memrl ask` / `memrl serve` (`memrl.recipes.reading`): `model.path` is
    `model` (the command's --model), the agent's section is MemAgentConfig's defaults, then
    `agent_defaults` (the command's own), then the settings stored with the model, then
    `[CONFIG] [key.path=value ...]` (`args`). A model trained as another agent: `warn` is
    told."""
    from memrl.config import load_command_config

    stored = stored_settings(model)
    if stored.agent not in (None, "memagent") and warn is not None:
        warn(f"{model} was trained as a {stored.agent} agent; {command} reads with MemAgent "
             "and its default settings")
    base = {"model": {"path": str(model)},
            "memagent": {**(agent_defaults or {}), **stored.values}}
    cfg = load_command_config(model_class, args, base=base)
    if cfg.model.path != str(model):
        raise MemrlInputError(f"the model is --model's ({model}): give it once",
                              location=f"model.path {cfg.model.path}")
    return cfg
