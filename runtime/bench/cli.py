"""``gymbus bench`` / ``python -m runtime.bench``: run the grid, print a JSON line per configuration, then tables."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from runtime.bench.grid import FULL, QUICK, Bounds, Config, expand

Csv = Annotated[str | None, typer.Option(help="Comma-separated values; default: the full grid (or --quick's).")]


def bench(
    quick: Annotated[
        bool, typer.Option("--quick", help="CI size: L=0, C in {1,4}, W=1, 12 rollouts per configuration.")
    ] = False,
    workload: Csv = None,
    latency_ms: Csv = None,
    concurrency: Csv = None,
    replicas: Csv = None,
    rollouts: Annotated[
        int | None,
        typer.Option(help="Most rollouts per configuration (default: no count bound, --seconds decides; --quick: 12)."),
    ] = None,
    seconds: Annotated[
        float,
        typer.Option(help="Measured seconds per configuration (after its first C Results; 3x that at most in all)."),
    ] = 20.0,
    drain_s: Annotated[float, typer.Option(help="Longest wait for rollouts in flight after it.")] = 60.0,
    worker_concurrency: Annotated[
        int | None, typer.Option(help="Messages per worker and subject (default max(64, C/W)).")
    ] = None,
    broker_sync: Annotated[
        str | None,
        typer.Option(
            help="Broker fsync policy: always (default, as shipped), a duration such as 20ms (fsync at most "
            "that often), or default (the server's 2 min); overrides $GYMBUS_BROKER_SYNC."
        ),
    ] = None,
    uvloop: Annotated[bool, typer.Option("--uvloop", help="Workers run on uvloop (GYMBUS_UVLOOP=1).")] = False,
    profile: Annotated[
        bool, typer.Option("--profile", help="py-spy each worker in the measured window; prints where time went.")
    ] = False,
    out: Annotated[
        Path | None, typer.Option(help="Folder for results.jsonl and logs (default runs/bench-<time>).")
    ] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep each configuration's broker store.")] = False,
) -> None:
    """Measure gymbus's own cost: the real stack (embedded broker, worker processes, the SIMULATED policy
    over HTTP) under a closed loop keeping C rollouts in flight, for each workload x L x C x W.

    Prints one JSON line per configuration on stdout (rollouts/s, agent steps/s, e2e and per-hop
    overhead p50/p99, CPU per rollout, peak memory per process, memory per in-flight rollout, ratio
    to the ideal C/(model calls x L)), then a table and the scaling curve on stderr. Each
    configuration gets a fresh stack and is bounded by --rollouts and --seconds. Exits 1 if any
    rollout was lost or failed.
    """
    from runtime.bench.run import Settings

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    base = QUICK if quick else FULL
    grid = expand(
        _strs(workload) or base.workload,  # type: ignore[arg-type]  # checked just below, naming the bad one
        [float(x) for x in _strs(latency_ms)] or base.latency_ms,
        [int(x) for x in _strs(concurrency)] or base.concurrency,
        [int(x) for x in _strs(replicas)] or base.replicas,
    )
    bad = [c for c in grid if c.workload not in ("answer", "tool")]
    if bad:
        raise typer.BadParameter(
            f"unknown workload {bad[0].workload!r}: choose answer or tool", param_hint="--workload"
        )
    folder = out or Path("runs") / datetime.now(UTC).strftime("bench-%Y%m%d-%H%M%S")
    bounds = Bounds(
        rollouts=rollouts if rollouts is not None else (12 if quick else None),
        seconds=seconds,
        drain_s=drain_s,
        warmup=2 if quick else 8,
    )
    from broker.server import BrokerError, sync_setting

    try:
        sync = sync_setting(broker_sync)
    except BrokerError as exc:
        raise typer.BadParameter(str(exc), param_hint="--broker-sync") from None
    settings = Settings(folder, bounds, worker_concurrency, sync, uvloop, profile, keep)
    rows = asyncio.run(_run(grid, settings))
    _print_tables(rows, settings)
    raise typer.Exit(0 if all(_ok(r) for r in rows) else 1)


async def _run(grid: list[Config], settings: Any) -> list[dict[str, Any]]:
    from runtime.bench.run import measure

    settings.folder.mkdir(parents=True, exist_ok=True)
    err = Console(stderr=True)
    rows = []
    with (settings.folder / "results.jsonl").open("a") as sink:
        for i, c in enumerate(grid, 1):
            err.print(f"[dim]\\[{i}/{len(grid)}] {c.label}[/]")
            try:
                row = await measure(c, settings)
            except Exception as exc:  # a configuration that cannot run is reported, and the grid goes on
                row = {**_keys(c), "error": f"{type(exc).__name__}: {exc}"}
            line = json.dumps(row)
            print(line, flush=True)
            sink.write(line + "\n")
            sink.flush()
            rows.append(row)
    return rows


def _print_tables(rows: list[dict[str, Any]], settings: Any) -> None:
    from runtime.bench import flame
    from runtime.bench.report import scaling, table

    err = Console(stderr=True, width=max(Console(stderr=True).width, 180))
    good = [r for r in rows if "error" not in r]
    title = f"gymbus bench ({len(good)} configurations, broker sync {settings.broker_sync}; in {settings.folder})"
    err.print(table(good, title))
    curve = scaling(good)
    if curve is not None:
        err.print(curve)
    for r in rows:
        if "error" in r:
            err.print(
                f"[red]{r['workload']} L={r['latency_ms']:g} C={r['concurrency']} W={r['replicas']}: {r['error']}"
            )
        for path in (r.get("profiles") or {}).values():
            if Path(path).exists():
                err.print(flame.summary(Path(path)))


def _ok(row: dict[str, Any]) -> bool:
    from runtime.bench.report import ok

    return "error" not in row and ok(row)


def _keys(c: Config) -> dict[str, Any]:
    return {"workload": c.workload, "latency_ms": c.latency_ms, "concurrency": c.concurrency, "replicas": c.replicas}


def _strs(csv: str | None) -> list[str]:
    return [x.strip() for x in csv.split(",") if x.strip()] if csv else []


def main(args: list[str] | None = None, prog_name: str = "python -m runtime.bench") -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(bench)
    app(args=args, prog_name=prog_name)
