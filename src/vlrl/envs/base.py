"""The environment API every task implements, and the registry that finds them by name.

An episode is driven like this (see `vlrl.rollout.episodes`)::

    env = make_env(config.env)                 # one env object per episode
    obs = env.reset(task)                      # first observation: images + text
    # send env.system_prompt + obs.to_content() to the model, then loop:
    result = env.step(model_text)              # reward for this turn, next observation
    ...until result.done; then env.episode_metrics() and env.trace()

An env class subclasses `Env` (below) and is registered with its config class,
`@register_env("name", config=MyEnvConfig)` (a subclass of `vlrl.envs.config.EnvConfigBase`;
`RunConfig.env` is validated by the class registered under `env.name`). It is built as
`cls(config)`. `Env` declares every hook the project calls: the episode (`reset`, `step`,
`episode_metrics`, `trace`, `oracle_response`) and the task lists (classmethods `build_split`,
`split_version`, `content_hash`, and `replay_trace`, which re-checks a recorded episode) are
abstract; the optional hooks (`task_group(task)`, the row label of per-group evaluation tables,
whose column is titled by `task_group_label`; `train_overlap`, `adhoc_task`, lineage facts, ...)
have defaults. Built-in envs register themselves when their package (listed in
`_BUILTIN_MODULES`) is imported; third-party packages register through the `vlrl.envs`
entry-point group. `make_env` loads both on first use.
"""

from __future__ import annotations

import base64
import importlib
import importlib.metadata
import io
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from PIL import Image
from pydantic import ValidationError

from vlrl.envs.config import SPLITS, EnvConfigBase
from vlrl.errors import VlrlError
from vlrl.sections import did_you_mean

_BUILTIN_MODULES = ("vlrl.envs.maze", "vlrl.envs.gui")
DEFAULT_ENV = "maze"  # the env of a config that names none
ENTRY_POINT_GROUP = "vlrl.envs"  # third-party env packages: `[project.entry-points."vlrl.envs"]`


@dataclass(frozen=True)
class Task:
    """One episode's specification: which env, which split and position, which seed, what variant.

    `params` is env-specific and JSON-able (the maze: size, placement, theme, transform, ...). It
    is copied at construction and hashed by its canonical JSON, so tasks can be dict keys.
    """

    env: str
    split: str
    index: int
    seed: int
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            params = json.loads(json.dumps(self.params, sort_keys=True))
        except (TypeError, ValueError) as exc:
            raise VlrlError(f"task params must be JSON-serialisable ({exc})") from None
        object.__setattr__(self, "params", params)

    def __hash__(self) -> int:
        return hash((self.env, self.split, self.index, self.seed, json.dumps(self.params, sort_keys=True)))

    @property
    def task_id(self) -> str:
        """Stable readable id, e.g. `maze/holdout/17/s10000017`."""
        return f"{self.env}/{self.split}/{self.index}/s{self.seed}"

    def to_json(self) -> dict[str, Any]:
        """A plain dict that `Task.from_json` reads back into an equal task."""
        return {
            "env": self.env,
            "split": self.split,
            "index": self.index,
            "seed": self.seed,
            "params": dict(self.params),
        }

    @classmethod
    def from_json(cls, data: Any) -> Task:
        """Read a task written by `to_json`; malformed input raises VlrlError."""
        if not isinstance(data, dict):
            raise VlrlError(f"a task must be a JSON object, got {type(data).__name__}")
        expected = {"env": str, "split": str, "index": int, "seed": int, "params": dict}
        for key, kind in expected.items():
            value = data.get(key)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise VlrlError(f"task JSON: '{key}' must be a {kind.__name__}, got {value!r}")
        extra = set(data) - set(expected)
        if extra:
            raise VlrlError(f"task JSON: unknown key(s) {sorted(extra)}")
        return cls(data["env"], data["split"], data["index"], data["seed"], data["params"])


def image_to_data_url(image: Image.Image) -> str:
    """PNG data URL of an image, as OpenAI-style chat APIs take it."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


@dataclass
class Observation:
    """What the model sees on one turn: images, then text."""

    images: list[Image.Image]
    text: str

    def to_content(self, image_format: Literal["pil", "data_url"] = "pil") -> list[dict[str, Any]]:
        """Chat content parts, images first then the text.

        `pil`: `[{"type": "image", "image": <PIL>}, {"type": "text", "text": ...}]` (HF processors);
        `data_url`: `[{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}, ...]` (OpenAI).
        """
        if image_format == "pil":
            parts: list[dict[str, Any]] = [{"type": "image", "image": im} for im in self.images]
        elif image_format == "data_url":
            parts = [{"type": "image_url", "image_url": {"url": image_to_data_url(im)}} for im in self.images]
        else:
            raise VlrlError(f"image_format must be 'pil' or 'data_url', got {image_format!r}")
        return parts + [{"type": "text", "text": self.text}]


@dataclass
class StepResult:
    """Outcome of one turn. `observation` is None once the episode is done."""

    observation: Observation | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """One episode at a time. Build a fresh env per episode (they are cheap).

    Every env class subclasses this (`register_env` refuses one that does not). The abstract
    methods are the episode and the task lists; the other hooks have defaults, for an env that
    has no such thing (docs/envs.md lists who calls each).
    """

    name: str  # set by `register_env`
    system_prompt: str
    config_class: ClassVar[type[EnvConfigBase] | None] = None  # set by `register_env`
    generator_version: ClassVar[str | None] = None  # recorded in the run's data lineage
    task_group_label: ClassVar[str] = "group"  # column title of per-group evaluation tables
    demonstrators: ClassVar[tuple[str, ...]] = ()  # imperfect demonstrators for train.sft.demonstrator

    # -- one episode -----------------------------------------------------------------------
    @abstractmethod
    def reset(self, task: Task) -> Observation:
        """Start the episode of `task` and return the first observation."""

    @abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Apply the model's raw response text; returns this turn's reward and the next observation."""

    @abstractmethod
    def episode_metrics(self) -> dict[str, float]:
        """success, turns, invalid_actions, wall_bumps, optimal_turns, return, ... as floats."""

    @abstractmethod
    def trace(self) -> dict[str, Any]:
        """The whole episode as JSON: task, env content, every turn's response, action and reward."""

    @abstractmethod
    def oracle_response(self) -> str:
        """The response an optimal player would give now, e.g. `<action>right</action>`."""

    def random_response(self, rng: random.Random) -> str:
        """A random response (SFT with `train.sft.noise > 0`); see `gives_random_responses`."""
        raise VlrlError(f"env '{self.name}' gives no random responses (a random_response(rng) method)")

    def start_demonstrator(self, name: str, rng: random.Random) -> None:
        """Start one of `demonstrators` on this episode (after reset); SFT checks the name before training."""
        raise VlrlError(f"env '{self.name}' has no demonstrator '{name}' (only its oracle)")

    def demonstrator_response(self) -> str:
        """The started demonstrator's response now, in the env's response format."""
        raise VlrlError(f"env '{self.name}' has no demonstrator (only its oracle)")

    def legal_responses(self) -> list[str]:
        """One response per legal action now, e.g. the moves not blocked by a wall (`algo.exploring_starts`
        tries each of them as a group's first move); see `lists_legal_responses`."""
        raise VlrlError(f"env '{self.name}' lists no legal responses (a legal_responses() method)")

    @classmethod
    def gives_random_responses(cls) -> bool:
        """Whether the env implements `random_response` (SFT checks it before training)."""
        return cls.random_response is not Env.random_response

    @classmethod
    def lists_legal_responses(cls) -> bool:
        """Whether the env implements `legal_responses` (checked before training with exploring starts)."""
        return cls.legal_responses is not Env.legal_responses

    def render_text(self) -> str | None:
        """A text drawing of the current state for `vlrl env play` in a terminal (None: none)."""
        return None

    def format_response(self, text: str) -> str:
        """A bare typed answer (`vlrl env play`) in the response format; default: as typed."""
        return text

    # -- the task lists --------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def build_split(cls, config: Any, split: str) -> Sequence[Task]:
        """The deterministic task list of a split (a lazy sequence for large splits)."""

    @classmethod
    @abstractmethod
    def split_version(cls, config: Any, split: str) -> str:
        """Short hash that changes when the split's tasks change."""

    @classmethod
    @abstractmethod
    def content_hash(cls, task: Task) -> str:
        """Hash of what the agent faces in `task` (for a maze: walls, start, goal), not of its seed."""

    @classmethod
    @abstractmethod
    def replay_trace(cls, trace: dict[str, Any]) -> dict[str, Any]:
        """Re-simulate a recorded episode from its own content (`vlrl.envs.replay`)."""

    @classmethod
    def task_group(cls, task: Task) -> str:
        """The group of `task` in per-group evaluation tables, e.g. "9x9" (maze size) or "level 1"."""
        return "all"

    @classmethod
    def train_overlap(cls, config: Any, tasks: list[Task]) -> list[Task] | None:
        """The tasks of `tasks` that show training content, found without listing the training split;
        None (the default): the env cannot tell that way (the protocol then compares content hashes)."""
        return None

    @classmethod
    def adhoc_task(cls, config: Any, seed: int) -> Task | None:
        """A task outside the splits made from `seed` (`vlrl env render/play --seed`); None: the env makes none."""
        return None

    @classmethod
    def describe_task(cls, task: Task) -> dict[str, str]:
        """Extra columns of `vlrl env split` for `task` (default: none)."""
        return {}

    @classmethod
    def data_lineage(cls, config: Any) -> dict[str, Any]:
        """Env facts about the data for the run's lineage; per-split facts under "splits" (default: none)."""
        return {}

    @classmethod
    def reward_spec(cls, config: Any) -> dict[str, Any]:
        """The settings that decide reward and success (hashed into the lineage); default: the env
        section without its name and splits."""
        return config.model_dump(mode="json", exclude={"name", *SPLITS})


# ---------------------------------------------------------------------------------------------
# registry

_REGISTRY: dict[str, type[Env]] = {}
_loaded = False


def register_env(name: str, *, config: type[EnvConfigBase] | None = None):
    """Class decorator: make an env class available to `make_env` under `name`.

    `config` is the env's config class, which validates `RunConfig.env` when `env.name` is
    `name`; a subclass of a registered env may leave it out and inherits its parent's.
    """

    def decorate(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, Env)):
            raise VlrlError(f"env '{name}': {cls!r} must be a subclass of vlrl.envs.base.Env")
        config_class = config or cls.config_class
        if config_class is None or not issubclass(config_class, EnvConfigBase):
            raise VlrlError(f"env '{name}': register_env needs config=<a subclass of vlrl.envs.config.EnvConfigBase>")
        try:
            config_class.model_validate({"name": name})
        except ValidationError as exc:
            raise VlrlError(
                f"env '{name}': its config class {config_class.__name__} must build from defaults with name '{name}' "
                f"({str(exc).splitlines()[-1].strip()})"
            ) from None
        cls.name = name
        cls.config_class = config_class
        _REGISTRY[name] = cls
        return cls

    return decorate


def _load_builtins() -> None:
    """Import the built-in env packages and the `vlrl.envs` entry points (once)."""
    global _loaded
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    if _loaded:
        return
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as exc:  # a broken plug-in is named, not a traceback from deep inside it
            raise VlrlError(f"env plug-in '{entry.name}' ({entry.value}) failed to load: {exc}") from None
    _loaded = True


def env_class(name: str) -> type[Env]:
    """The class registered under `name` (importing the built-in envs first if needed)."""
    if name not in _REGISTRY:
        _load_builtins()
    if name not in _REGISTRY:
        raise VlrlError(f"unknown environment '{name}'; {did_you_mean(name, sorted(_REGISTRY))}")
    return _REGISTRY[name]


def registered_envs() -> list[str]:
    """Names of all registered environments."""
    _load_builtins()
    return sorted(_REGISTRY)


def env_config_class(name: str) -> type[EnvConfigBase]:
    """The config class of the env registered under `name`."""
    return env_class(name).config_class


def env_config(data: Any) -> EnvConfigBase:
    """Validate an `env:` section by the config class of its `name` (DEFAULT_ENV when it has none).

    Errors are pydantic ValidationErrors located in the section (`name`, or the env's own keys),
    so `RunConfig` reports them as `env.KEY` with a did-you-mean over that env's fields.
    """
    if isinstance(data, EnvConfigBase):
        return data
    if not isinstance(data, dict):
        return data  # pydantic reports the wrong type against EnvConfigBase
    name = data.get("name", DEFAULT_ENV)
    known = registered_envs()
    if name not in known:
        hint = did_you_mean(str(name), known)
        raise ValidationError.from_exception_data(
            "env",
            [
                {
                    "type": "value_error",
                    "loc": ("name",),
                    "input": name,
                    "ctx": {"error": ValueError(f"unknown environment '{name}'; {hint}")},
                }
            ],
        )
    return _REGISTRY[name].config_class.model_validate({**data, "name": name})


def default_env_config() -> EnvConfigBase:
    """The config of DEFAULT_ENV with all its defaults."""
    return env_config_class(DEFAULT_ENV)()


def make_env(config: EnvConfigBase) -> Env:
    """A fresh environment of kind `config.name`."""
    return env_class(config.name)(config)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise VlrlError(f"unknown split '{split}'; use one of {', '.join(SPLITS)}")


def build_split(config: EnvConfigBase, split: str) -> Sequence[Task]:
    """The deterministic task list of a split (a lazy sequence for large splits)."""
    _check_split(split)
    return env_class(config.name).build_split(config, split)


def split_version(config: EnvConfigBase, split: str) -> str:
    """Short hash over the generator version and the split's parameters."""
    _check_split(split)
    return env_class(config.name).split_version(config, split)


def task_content_hash(task: Task) -> str:
    """Hash of what the agent faces in `task` (for a maze: walls, start, goal), not of its seed."""
    return env_class(task.env).content_hash(task)


def overlapping_tasks(a: Sequence[Task], b: Sequence[Task]) -> list[tuple[Task, Task]]:
    """Pairs (task of a, task of b) whose content is the same; empty when the lists are disjoint."""
    by_hash: dict[str, list[Task]] = {}
    for task in b:
        by_hash.setdefault(task_content_hash(task), []).append(task)
    return [(ta, tb) for ta in a for tb in by_hash.get(task_content_hash(ta), [])]


def task_group(task: Task) -> str:
    """The evaluation-table group of `task` (the env's `task_group`, e.g. "9x9"; "all" for an env without one)."""
    return str(env_class(task.env).task_group(task))


def task_group_label(env_name: str) -> str:
    """What the env's task groups are, as a table column title ("maze size" for the maze; default "group")."""
    return env_class(env_name).task_group_label


def replay_trace(trace: dict[str, Any]) -> dict[str, Any]:
    """Re-simulate a recorded episode from its own content; see the env's `replay_trace`."""
    if not isinstance(trace, dict) or not isinstance(trace.get("env"), str):
        raise VlrlError("a trace must be a JSON object with an 'env' name")
    return env_class(trace["env"]).replay_trace(trace)


def step_all(envs: Sequence[Env], actions: Sequence[str]) -> list[StepResult]:
    """Step many episodes, one response each, in order."""
    if len(envs) != len(actions):
        raise VlrlError(f"step_all got {len(envs)} envs but {len(actions)} actions")
    return [env.step(text) for env, text in zip(envs, actions)]
