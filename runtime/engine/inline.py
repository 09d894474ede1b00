"""Verification in the agent's own turn, for environments whose verifier is pure and quick.

An environment declaring ``verify_inline`` registers the import string of itself and its source's
digest (registry.py). When an agent's turn ends the rollout (phase ``verify``), an agent worker that
imports the same code runs the verifier in that same transition: the session goes from the model's
last turn to ``done`` in one compare-and-set, and the Result is the message that follows. That saves
one hop per rollout (a session write, a message, an ack and a read).

It is an optimization, never a second path to a reward: the verifier is the environment's own
function, run on the same session. A worker that cannot import it, finds another digest (an agent
image older or newer than the environment's), or sees the verifier raise, leaves the phase at
``verify`` and the environment's worker verifies as before, with its retries and failure kinds.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

from broker.functions import Registration
from runtime.engine.admission import Admission
from runtime.engine.registry import source_digest
from runtime.errors import ConfigError
from runtime.sdk import Environment, load

log = logging.getLogger("gymbus.runtime")

INLINE_ENV = "GYMBUS_VERIFY_INLINE"
"""Set to 0 for agent workers that leave every verification to the environments' workers."""


def inline_from_env() -> bool:
    """``GYMBUS_VERIFY_INLINE``: 1 (the default) or 0; anything else is a mistake, named in one line."""
    value = os.environ.get(INLINE_ENV, "1").strip()
    if value not in ("0", "1"):
        raise ConfigError(
            f"{INLINE_ENV}={value!r}: set it to 1 (verify in the agent's last turn, the default) or 0 "
            "(every verification a hop to the environment's workers)"
        )
    return value == "1"


@dataclass
class Verifiers:
    """The environments an agent worker verifies in its own turn, loaded once per registered version."""

    admission: Admission
    _loaded: dict[tuple[str, str], Environment | None] = field(default_factory=dict)

    async def get(self, name: str) -> Environment | None:
        """The environment to verify ``name``'s rollouts here, or None to take the hop."""
        reg = await self.admission.environment(name)
        if reg is None or not reg.verify_ref:
            return None
        key = (reg.verify_ref, reg.verify_digest)
        if key not in self._loaded:
            self._loaded[key] = _load(reg)
        return self._loaded[key]


def _load(reg: Registration) -> Environment | None:
    try:
        env = load(reg.verify_ref)
    except (LookupError, ImportError) as exc:
        log.info("verifying %r by hop: this worker cannot import %s (%s)", reg.name, reg.verify_ref, exc)
        return None
    module = sys.modules.get(reg.verify_ref.partition(":")[0])
    path = getattr(module, "__file__", None)
    if not isinstance(env, Environment) or env.name != reg.name or not env.verify_inline or path is None:
        log.info("verifying %r by hop: %s is not that environment with verify_inline", reg.name, reg.verify_ref)
        return None
    if source_digest(path) != reg.verify_digest:
        log.warning(
            "verifying %r by hop: this worker's %s differs from the environment workers' (another version)",
            reg.name,
            path,
        )
        return None
    return env
