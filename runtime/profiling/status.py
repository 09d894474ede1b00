"""``gymbus profile`` and ``gymbus status``: profiles and runs, offline from a folder or live from the broker.

Nothing here consumes: the live views read the profiler's snapshots and the consumers' state.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError, NotFoundError
from rich.console import Console
from rich.live import Live

from broker import topology
from broker.connect import connect
from runtime.errors import UsageError
from runtime.model.endpoints import entry_decoder
from runtime.profiling import profile, runfolder
from runtime.profiling.profiler import read_snapshot
from runtime.profiling.report import write_all
from runtime.profiling.tables import profile_table, status_table


class StatusError(UsageError, RuntimeError):
    """No broker to ask, or nothing there yet; the message says what to do."""


def offline(console: Console, run_dir: Path, pass_threshold: float | None, *, as_json: bool, write: bool) -> None:
    """Profile a run folder, (re)write its profile files unless told not to, and print the profile."""
    if write:
        write_all(run_dir, pass_threshold)
    info, samples = runfolder.load(run_dir, pass_threshold)
    prof, tasks = profile.build(info, samples, source="offline")
    if as_json:
        print(msgspec.json.encode({"profile": prof, "tasks": tasks}).decode())
        return
    console.print(profile_table(prof))
    if write:
        console.print(f"\n wrote  {run_dir / 'profile.json'}, tasks.jsonl, report.html")


async def live(console: Console, url: str, run_id: str, *, as_json: bool, watch: bool) -> None:
    """Print a run's live profile (the profiler's snapshot); with ``watch``, redraw until the run completes."""
    nc = await reach(url)
    try:
        js = nc.jetstream()
        snap = await read_snapshot(js, run_id)
        if snap is None:
            raise StatusError(f"no live profile of run {run_id!r} at {url}: is a profiler running (`gymbus profiler`)?")
        if as_json:
            print(msgspec.json.encode(snap).decode())
        elif not watch:
            console.print(profile_table(snap.profile))
        else:
            with Live(profile_table(snap.profile), console=console, refresh_per_second=2) as view:
                while (snap.profile.completion or 0.0) < 1.0:
                    await asyncio.sleep(1.0)
                    snap = await read_snapshot(js, run_id) or snap
                    view.update(profile_table(snap.profile))
    finally:
        await nc.close()


async def show(console: Console, url: str, *, as_json: bool) -> None:
    """Print the runs the broker knows and every durable consumer's backlog."""
    nc = await reach(url)
    try:
        js = nc.jetstream()
        found, backlog, deployed = await runs(js), await consumers(js), await models(js)
    finally:
        await nc.close()
    if as_json:
        print(msgspec.json.encode({"broker": url, "runs": found, "models": deployed, "consumers": backlog}).decode())
        return
    console.print(f"broker {url}")
    console.print(status_table(found, backlog, deployed))


async def reach(url: str) -> Client:
    """A connection for a look; one line naming the URL if no broker answers there."""
    return await connect(url, name="gymbus-cli", connect_timeout_s=5.0)


def live_broker(output: str | Path, run_id: str | None = None) -> str:
    """The broker URL of a run still going in ``output`` (its metadata.json has no ``finished_at``).

    With ``run_id``, that run's; otherwise the most recently started one. This is how the CLI finds
    the embedded broker ``gymbus collect`` started, whose port is chosen at random.
    """
    root = Path(output)
    paths = [root / run_id / "metadata.json"] if run_id else sorted(root.glob("*/metadata.json"))
    live = []
    for path in paths:
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("nats_url") and "finished_at" not in meta:
            live.append((meta.get("started_at") or 0.0, meta["nats_url"]))
    if not live:
        where = Path(output) / run_id if run_id else Path(output) / "*"
        raise StatusError(f"no broker: give --nats URL or set GYMBUS_NATS_URL (no running collect in {where})")
    return max(live)[1]


async def runs(js: JetStreamContext) -> list[dict[str, Any]]:
    """Every run with a manifest or a profile in the ``runs`` bucket, newest first."""
    try:
        kv = await js.key_value(topology.RUNS)
        keys = await kv.keys()
    except (BucketNotFoundError, NoKeysError):  # a broker no gymbus process has set up, or no run yet
        return []
    ids = sorted({k.rsplit(".", 1)[0] for k in keys if k.endswith((".manifest", ".profile"))})
    out = []
    for run_id in ids:
        manifest: dict[str, Any] = {}
        if topology.manifest_key(run_id) in keys:
            manifest = json.loads((await kv.get(topology.manifest_key(run_id))).value or b"{}")
        snap = await read_snapshot(js, run_id)
        out.append(
            {
                "run_id": run_id,
                "expected": manifest.get("expected"),
                "created_at": manifest.get("created_at"),
                "profile": snap.profile if snap else None,
            }
        )
    return sorted(out, key=lambda r: r["created_at"] or 0.0, reverse=True)


async def models(js: JetStreamContext) -> list[dict[str, Any]]:
    """Every entry of the ``models`` bucket: the model name, its deployment, who wrote it and when."""
    try:
        kv = await js.key_value(topology.MODELS)
        keys = await kv.keys()
    except (BucketNotFoundError, NoKeysError):
        return []
    out = []
    for key in sorted(keys):
        try:
            entry = entry_decoder.decode((await kv.get(key)).value or b"{}")
        except (KeyNotFoundError, msgspec.DecodeError):
            continue
        out.append({"model": key, **msgspec.structs.asdict(entry)})
    return out


async def consumers(js: JetStreamContext) -> list[dict[str, Any]]:
    """Backlog of every durable consumer: pending (not yet delivered), in flight (unacked), redelivered."""
    out = []
    for stream in (topology.WORK_STREAM, topology.RESULTS_STREAM):
        try:
            infos = await js.consumers_info(stream)
        except NotFoundError:
            continue
        for c in sorted(infos, key=lambda c: c.name or ""):
            if not c.config.durable_name:  # ordered consumers of collectors and readers come and go
                continue
            out.append(
                {
                    "stream": stream,
                    "name": c.name,
                    "pending": c.num_pending or 0,
                    "ack_pending": c.num_ack_pending or 0,
                    "redelivered": c.num_redelivered or 0,
                }
            )
    return out
