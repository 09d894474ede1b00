"""``gymbus status`` and ``gymbus profile --run``: what the broker knows of runs, read without consuming anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NoKeysError, NotFoundError

from broker import topology
from runtime.profiler import read_snapshot


def live_broker(output: str | Path, run_id: str | None = None) -> str | None:
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
    return max(live)[1] if live else None


async def runs(js: JetStreamContext) -> list[dict[str, Any]]:
    """Every run with a manifest or a profile in the ``runs`` bucket, newest first."""
    kv = await js.key_value(topology.RUNS)
    try:
        keys = await kv.keys()
    except NoKeysError:
        keys = []
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
