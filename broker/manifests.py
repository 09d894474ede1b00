"""A run's manifest: what a run id is bound to and what its rollouts get where their Start says nothing.

Kept in the KV bucket ``runs`` under ``<run_id>.manifest``; JSON, like the wire messages.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from broker.params import Sampling
from broker.schemas import Options, RunId


class RunIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """What a run id is bound to, recorded when the run starts: resuming with other values is refused
    (rows of another dataset must never land next to a run's rewards)."""

    input_digest: str
    """SHA-256 of the task file's bytes."""
    input: str = ""
    """The task file the run started from (for the reader; not compared)."""
    agent: str
    env: str
    agent_ref: str | None = None
    env_ref: str | None = None
    model: str = "policy"
    """The served model name the rollouts call."""
    repeats: int
    """Rollouts per task; raised on purpose with `gymbus collect --extend`, never lowered."""
    limit: int | None = None
    """First tasks of the file only (None: all); raised on purpose with --extend."""
    sampling: dict[str, Any] = {}
    options: dict[str, Any] = {}
    """The rollouts' options (limits, retry policy, ...), as sent in every Start."""
    env_tools: bool = True


class RunDefaults(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a run's rollouts get where their Start says nothing, applied by the agent worker."""

    sampling: Sampling = Sampling()
    """Sampling parameters for each Start whose ``responses_create_params`` does not set them (null: not set)."""
    options: Options = Options()
    """Options for each Start whose ``options`` leave them out (field by field)."""
    env_tools: bool = True
    """Offer the environment's tools to the model when a Start's ``responses_create_params`` has no ``tools``."""


class Manifest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A run's manifest, in the KV bucket ``runs`` under ``<run_id>.manifest``: written by whoever
    starts the run (`gymbus collect`, `gymbus submit`, or any producer), before its Starts. The agent
    workers apply its ``defaults`` to the run's Starts; `gymbus status` and the profiler read its
    totals (without it a run's total is unknown)."""

    run_id: RunId
    expected: Annotated[int, Meta(ge=0)]
    """Rollouts the run submits in all: tasks x repeats."""
    tasks: Annotated[int, Meta(ge=0)] | None = None
    """Task rows in the run."""
    repeats: Annotated[int, Meta(ge=1)] | None = None
    """Rollouts per task: the largest k of pass@k."""
    pass_threshold: float = 1.0
    """A scored rollout passes (pass@k, majority@k) when its reward is at least this."""
    created_at: float = 0.0
    """Unix time the run started."""
    identity: RunIdentity | None = None
    """What the run id is bound to (written by gymbus; other producers may leave it out)."""
    defaults: RunDefaults = msgspec.field(default_factory=RunDefaults)
    """What the run's rollouts get where their Start says nothing."""


manifest_decoder = msgspec.json.Decoder(Manifest)
