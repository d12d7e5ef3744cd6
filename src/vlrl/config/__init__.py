"""One typed configuration for a whole run.

A run is described by a `RunConfig`: a YAML file (see `configs/`) plus dotted command-line
overrides such as `algo.group_size=8`. Its sections live in `policy.py` (model, LoRA, rollout,
algorithm), `train.py` (SFT, vision pretraining, guards, the training loop) and `platform.py`
(runtime, storage, tracking, registry, serving); every field there has a type, a default and a
description, and `vlrl config show --doc` prints them all. Unknown keys, wrong types and impossible values are
errors that name the key and the file, with a did-you-mean suggestion for typos.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from vlrl.config.platform import (  # noqa: F401  (re-exported: `from vlrl.config import ...`)
    RegistryConfig,
    RuntimeConfig,
    ServingConfig,
    StorageConfig,
    TrackingConfig,
)
from vlrl.config.policy import (  # noqa: F401  (re-exported: `from vlrl.config import ...`)
    ALGO_PRESETS,
    AlgoConfig,
    LoraConfig,
    ModelConfig,
    RolloutConfig,
    TinyPreset,
    apply_algo_preset,
)
from vlrl.config.train import (  # noqa: F401  (re-exported: `from vlrl.config import ...`)
    EntropyGuard,
    GradSpikeGuard,
    GuardAction,
    GuardsConfig,
    KlGuard,
    NonFiniteGuard,
    RewardHackingGuard,
    SftConfig,
    TrainConfig,
    VisionPretrainConfig,
)
from vlrl.envs.base import DEFAULT_ENV, default_env_config, env_config, env_config_class
from vlrl.envs.config import EnvConfigBase
from vlrl.errors import ConfigError, VlrlError
from vlrl.sections import Section, closest  # noqa: F401  (Section re-exported for `from vlrl.config import Section`)


class RunConfig(Section):
    """A whole run. Each section is documented field by field."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Base model and LoRA.")
    env: SerializeAsAny[EnvConfigBase] = Field(
        default_factory=default_env_config,
        description="Environment and its splits; `env.name` selects the registered env whose config class validates "
        "the section.",
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout engine and sampling.")
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="GRPO and its variants.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation, evaluation and checkpoints.")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, description="Ray workers and placement.")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Where runs are written.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow and metrics.")
    serving: ServingConfig = Field(default_factory=ServingConfig, description="Adapter serving.")
    registry: RegistryConfig = Field(
        default_factory=RegistryConfig, description="Adapter registry and its promotion gate."
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_by_name(cls, value: Any) -> Any:
        return env_config(value)

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.algo.mini_batch_size % self.algo.micro_batch_size:
            raise ValueError(
                f"algo.mini_batch_size ({self.algo.mini_batch_size}) must be a multiple of "
                f"algo.micro_batch_size ({self.algo.micro_batch_size})"
            )
        if self.algo.step_advantage_weight > 0 and self.algo.ratio_level == "sequence":
            raise ValueError(
                "algo.step_advantage_weight > 0 (per-turn advantages) needs algo.ratio_level 'token', not "
                "'sequence' (GSPO)"
            )
        return self


# --------------------------------------------------------------------------------------------
# loading


def _section_class(ann: Any, data: Any) -> type[BaseModel] | None:
    """The model class a field of annotation `ann` validates `data` with; None for a leaf.

    The env section is validated by the config class of the env its data names."""
    if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
        return None
    if ann is EnvConfigBase:
        name = data.get("name", DEFAULT_ENV) if isinstance(data, dict) else DEFAULT_ENV
        try:
            return env_config_class(str(name))
        except VlrlError:
            return ann
    return ann


def _section_at(path: tuple[str, ...], data: Any) -> type[BaseModel] | None:
    """The pydantic model class at a dotted path of RunConfig, or None past a leaf."""
    cls: type[BaseModel] | None = RunConfig
    for part in path:
        field = cls.model_fields.get(part)
        if field is None:
            return None
        data = data.get(part) if isinstance(data, dict) else None
        cls = _section_class(field.annotation, data)
        if cls is None:
            return None
    return cls


def _explain(err: dict[str, Any], source: str, data: dict[str, Any]) -> str:
    loc = tuple(str(p) for p in err["loc"])
    key = ".".join(loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        section = _section_at(loc[:-1], data)
        known = list(section.model_fields) if section else []
        close = closest(loc[-1], known)
        hint = (
            f"; did you mean '{'.'.join(loc[:-1] + (close,))}'?"
            if close
            else (f"; known keys: {', '.join(known)}" if known else "")
        )
        return f"{source}: unknown key '{key}'{hint}"
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    if err["type"] == "literal_error" and isinstance(value, str):
        choices = re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", ""))
        close = closest(value, choices)
        if close:
            msg = f"{msg}; did you mean '{close}'?"
    if isinstance(value, dict):
        return f"{source}: {key}: {msg}"
    return f"{source}: {key} = {value!r}: {msg}"


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`update` laid over `base`, section by section, so a file may set only some fields of a section."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`algo.group_size=8` -> ("algo.group_size", 8); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key.sub=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _defaults(data: dict[str, Any]) -> dict[str, Any]:
    """The default RunConfig as a dict, its env section that of the env `data` names."""
    defaults = RunConfig().model_dump()
    env = data.get("env")
    name = env.get("name", DEFAULT_ENV) if isinstance(env, dict) else DEFAULT_ENV
    try:
        defaults["env"] = env_config_class(str(name))().model_dump()
    except VlrlError:  # an unknown name: validation reports it with a did-you-mean
        defaults["env"] = {}
    return defaults


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a RunConfig from YAML (or defaults when path is None) and apply dotted overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise ConfigError(f"{p}:{where} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections (model:, env:, ...)")
        data = loaded
    for text in overrides or []:
        key, value = parse_override(text)
        _set_dotted(data, key, value)
    if overrides:
        source += " (with overrides)"
    if isinstance(data.get("algo"), dict):
        data["algo"] = apply_algo_preset(data["algo"])
    merged = _deep_merge(_defaults(data), data)
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        errors = exc.errors()
        first = _explain(errors[0], source, merged)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(first + more) from None


def config_to_yaml(config: RunConfig) -> str:
    """The fully resolved config as YAML, every field included."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def describe_fields(
    cls: type[BaseModel] = RunConfig, prefix: str = "", env: str = DEFAULT_ENV
) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every leaf field, for `vlrl config show --doc`.

    The `env.*` rows are the fields of the config class of the env named `env`."""
    rows: list[tuple[str, str, str, str]] = []
    for name, field in cls.model_fields.items():
        ann = field.annotation
        key = f"{prefix}{name}"
        section = _section_class(ann, {"name": env})
        if section is not None:
            rows.extend(describe_fields(section, key + ".", env))
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        type_name = ann.__name__ if isinstance(ann, type) else str(ann).replace("typing.", "")
        rows.append((key, type_name, repr(default), field.description or ""))
    return rows
