"""Run configuration: one YAML file (agent + environment + model + limits), strictly checked.

Unknown keys are errors (a typo should fail), and every error names the key path and the value.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from broker.params import Sampling
from broker.schemas import Name, Options
from runtime.errors import ConfigError


class Strict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class SimulateConfig(Strict):
    """The simulated policy started when ``model.base_url`` is not set."""

    accuracy: Annotated[float, Meta(ge=0, le=1)] = 0.8
    latency_ms: Annotated[float, Meta(ge=0)] = 0.0
    seed: int = 0


class ModelConfig(Strict):
    name: str = "policy"
    """Served model name: sent in requests and used as the key in the ``models`` bucket."""
    base_url: str | None = None
    """OpenAI-compatible base URL(s), comma-separated (e.g. http://localhost:8000/v1). None: simulate."""
    api: Literal["auto", "responses", "chat"] = "auto"
    reasoning: Literal["server", "think_tags"] = "server"
    """The one layer that parses reasoning: the server's `reasoning` field, or <think> tags in gymbus."""
    timeout_s: Annotated[float, Meta(gt=0)] = 300.0
    """Budget of one model HTTP attempt."""
    attempts: Annotated[int, Meta(ge=1)] = 4
    """Attempts per model call before the rollout fails with model_error."""
    simulate: SimulateConfig = msgspec.field(default_factory=SimulateConfig)


class LimitsConfig(Options, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Same fields as the wire ``Options``."""

    def options(self) -> Options:
        return Options(**msgspec.structs.asdict(self))


class WorkersConfig(Strict):
    replicas: Annotated[int, Meta(ge=1)] = 1
    """Worker processes per function (embedded broker only)."""
    concurrency: Annotated[int, Meta(ge=1)] = 64
    """Messages each worker handles at once."""
    in_flight: Annotated[int, Meta(ge=1)] | None = None
    """Rollouts of the run submitted and without a Result at once; more are submitted as Results arrive
    (default: 4 x replicas x concurrency). Raise it for a shared broker whose workers serve more."""

    def window(self) -> int:
        return self.in_flight or 4 * self.replicas * self.concurrency


class ProfileConfig(Strict):
    """How the run's reward profile is computed (``gymbus profile``, the live profiler, the report)."""

    pass_threshold: float = 1.0
    """A scored rollout passes (for pass@k, majority@k, pass rates) when its reward is at least this."""


class RunConfig(Strict):
    input: str
    """JSONL of NeMo Gym-shaped task rows."""
    agent: Name
    env: Name
    agent_ref: str | None = None
    """Import string of the agent (default: functions.<agent>)."""
    env_ref: str | None = None
    """Import string of the environment (default: functions.<env>)."""
    repeats: Annotated[int, Meta(ge=1)] = 1
    limit: Annotated[int, Meta(ge=1)] | None = None
    output: str = "runs"
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    sampling: Sampling = Sampling()
    """The run's default sampling parameters (a task's own values win; null: not set)."""
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    workers: WorkersConfig = msgspec.field(default_factory=WorkersConfig)
    env_tools: bool = True
    """Offer the environment's tools to the model when a task row lists none."""
    nats: str | None = None
    """Broker URL; None starts an embedded broker (and the workers the run needs)."""
    profile: ProfileConfig = msgspec.field(default_factory=ProfileConfig)
    models: dict[str, ModelConfig] = {}
    """Other models the environments and the agent call by name (judges, user and tool simulators):
    name -> where it is served. With no ``base_url`` (and no ``model.base_url``), the simulated policy
    serves it too."""
    agent_options: dict[str, Any] = {}
    """The agent's own settings (its ``config``), e.g. ``{"max_corrections": 2}``: checked before the
    run starts, carried in each Start of the agent's rollouts."""

    def options(self) -> Options:
        """The rollouts' options: ``limits``, with ``agent_options``."""
        limits = self.limits.options()
        if not self.agent_options:
            return limits
        return msgspec.structs.replace(limits, agent_options={**limits.agent_options, **self.agent_options})


FLAGS = {
    "input": "--input",
    "output": "--output",
    "limit": "--limit",
    "repeats": "--repeats",
    "nats": "--nats",
    "model.base_url": "--model-url",
    "workers.concurrency": "--concurrency",
}
"""The CLI flag that sets each overridable key: a value that fails validation is blamed on its flag."""

_AT = re.compile(r" - at `\$\.([^`\[]+)")


def load_config(path: str | Path, **overrides: Any) -> RunConfig:
    """Read a YAML run config; ``overrides`` (CLI options, by key path) replace its keys when not None.

    A relative ``input`` in the file is relative to the file (so a config runs from any directory);
    one given as an override is relative to the working directory, as any command-line path."""
    p = Path(path)
    try:
        raw = msgspec.yaml.decode(p.read_bytes()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {str(p)!r} is a directory, not a YAML file") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(raw).__name__}")
    if isinstance(raw.get("input"), str) and not os.path.isabs(raw["input"]):
        raw["input"] = os.path.normpath(p.parent / raw["input"])
    given = {k: v for k, v in overrides.items() if v is not None}
    for key, value in given.items():
        section, _, field = key.partition(".")
        if field:
            raw.setdefault(section, {})[field] = value
        else:
            raw[key] = value
    try:
        return msgspec.convert(raw, RunConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(_blame(p, str(exc), given)) from exc


def _blame(path: Path, error: str, given: dict[str, Any]) -> str:
    """The error, blamed on the flag that set the failing key, else on the config file."""
    at = _AT.search(error)
    key = at.group(1) if at else ""
    if key in given:
        return f"{FLAGS.get(key, key)} {given[key]!r}: {error[: at.start()] if at else error}"
    return f"{path}: {error}"
