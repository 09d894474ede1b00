"""A run id is bound to what it ran: the identity recorded when a run starts, checked on every resume.

Resuming run X with another input file, agent, environment, model name, sampling, options or
repeats would put rows of one experiment next to another's rewards, so it is refused with one
line naming each field that differs, both values, and the way out. Raising ``repeats`` or
``limit`` on purpose is `--extend`; nothing lowers them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from broker import topology
from broker.manifests import Manifest, RunIdentity, manifest_decoder
from runtime.errors import InputError
from runtime.runs.config import RunConfig
from runtime.runs.tasks import file_digest

_NOT_COMPARED = {"input"}
_EXTENSIBLE = {"repeats", "limit"}


def identity_of(cfg: RunConfig) -> RunIdentity:
    return RunIdentity(
        input_digest=file_digest(cfg.input),
        input=str(Path(cfg.input)),
        agent=cfg.agent,
        env=cfg.env,
        agent_ref=cfg.agent_ref,
        env_ref=cfg.env_ref,
        model=cfg.model.name,
        repeats=cfg.repeats,
        limit=cfg.limit,
        sampling=cfg.sampling.given(),
        options=msgspec.to_builtins(cfg.options()),
        env_tools=cfg.env_tools,
    )


def check_resume(run_id: str, recorded: RunIdentity, now: RunIdentity, *, extend: bool) -> None:
    """InputError naming every difference, unless ``now`` is ``recorded`` (or extends it, with ``extend``)."""
    diffs = [d for f in recorded.__struct_fields__ if (d := _difference(f, recorded, now, extend))]
    if not diffs:
        return
    grow = " or raise repeats/limit on purpose with --extend" if not extend else ""
    raise InputError(
        f"run {run_id!r} was started with other settings, and a run id is bound to what it ran: "
        f"{'; '.join(diffs)}. Resume it with its own settings{grow}, or start a new run "
        "(leave out --run-id, or give a new one)"
    )


def _difference(field: str, old: RunIdentity, new: RunIdentity, extend: bool) -> str | None:
    a, b = getattr(old, field), getattr(new, field)
    if field in _NOT_COMPARED or a == b:
        return None
    if extend and field in _EXTENSIBLE and _grows(a, b):
        return None
    if field == "input_digest":
        return f"input {old.input} (sha256 {a[:12]}) now {new.input} (sha256 {b[:12]})"
    shrink = " (lowering is never allowed)" if field in _EXTENSIBLE and _grows(b, a) else ""
    return f"{field} {_show(a)} now {_show(b)}{shrink}"


def _grows(a: int | None, b: int | None) -> bool:
    """Whether b covers more than a (None: no limit, the most)."""
    return b is None if a is None else (b is None or b > a)


def _show(value: Any) -> str:
    return "none" if value is None else repr(value)


async def open_manifest(
    js: JetStreamContext, manifest: Manifest, *, extend: bool, folder: RunIdentity | None
) -> bool:
    """Record the run's manifest in the ``runs`` bucket, or check a resume against the one there (and
    the run folder's record, for a broker that never saw the run). True if this broker had none."""
    assert manifest.identity is not None
    if folder is not None:
        check_resume(manifest.run_id, folder, manifest.identity, extend=extend)
    kv = await js.key_value(topology.RUNS)
    key = topology.manifest_key(manifest.run_id)
    while True:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            manifest.created_at = manifest.created_at or time.time()
            try:
                await kv.create(key, msgspec.json.encode(manifest))
                return True
            except KeyWrongLastSequenceError:
                continue  # another process started the run at the same moment: check against its manifest
        old = manifest_decoder.decode(entry.value or b"{}")
        if old.identity is not None:
            check_resume(manifest.run_id, old.identity, manifest.identity, extend=extend)
        same = (old.identity, old.expected, old.defaults) == (manifest.identity, manifest.expected, manifest.defaults)
        if same:
            return False
        manifest.created_at = old.created_at
        try:
            await kv.update(key, msgspec.json.encode(manifest), last=entry.revision)
            return False
        except KeyWrongLastSequenceError:
            continue
