"""Commands that look at runs and the broker: status, profile, traces, dead-letters, schema."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from runtime.cli.common import NatsOpt, RunDirOpt, console, run, with_broker
from runtime.errors import UsageError

if TYPE_CHECKING:
    from runtime.engine.deadletters import Letter

OutputOpt = Annotated[
    Path, typer.Option("--output", "-o", help="Folder of run folders (finds a running embedded broker).")
]


def status(
    nats: NatsOpt = None,
    output: OutputOpt = Path("runs"),
    as_json: Annotated[bool, typer.Option("--json", help="Print runs, models and consumers as JSON.")] = False,
) -> None:
    """Runs the broker knows (progress, mean reward, pass@1, failures, rate), the models registered in the
    models bucket (endpoints, settings, who wrote them, when) and every consumer's backlog."""
    from runtime.profiling import status as st

    run(st.show(console, nats or st.live_broker(output, None), as_json=as_json))


def profile(
    run_dir: Annotated[
        Path | None, typer.Argument(help="A run folder, e.g. runs/<run_id>/: profiled offline, no broker needed.")
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run", help="A run id: its live profile, as the profiler last stored it.")
    ] = None,
    nats: NatsOpt = None,
    output: OutputOpt = Path("runs"),
    pass_threshold: Annotated[
        float | None,
        typer.Option("--pass-threshold", help="Offline: a rollout passes when reward >= this (default: the config's)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {profile, tasks} as JSON.")] = False,
    write: Annotated[
        bool, typer.Option("--write/--no-write", help="Offline: (re)write profile.json, tasks.jsonl, report.html.")
    ] = True,
    watch: Annotated[bool, typer.Option("--watch", help="Live: redraw every second until the run completes.")] = False,
) -> None:
    """Reward profile of a run: rewards, pass@k, majority@k, failures by kind, latency per hop, throughput.

    Offline, `gymbus profile runs/<run_id>/` reads rollouts.jsonl and writes profile.json, tasks.jsonl
    and the self-contained report.html into the folder. Live, `gymbus profile --run RUN_ID` shows the
    snapshot the profiling consumer keeps in the broker while the run goes (`gymbus profiler`; `gymbus
    collect` starts one); the broker is --nats, GYMBUS_NATS_URL, or the embedded one of a running collect.
    """
    from runtime.profiling import status as st

    if (run_dir is None) == (run_id is None):
        raise UsageError("give a run folder (offline) or --run RUN_ID (live), not both")
    if run_id is not None and pass_threshold is not None:
        raise UsageError("--pass-threshold applies to offline profiles; a live one uses the run's config")
    if run_dir is not None:
        st.offline(console, run_dir, pass_threshold, as_json=as_json, write=write)
    else:
        url = nats or st.live_broker(output, run_id)
        run(st.live(console, url, run_id or "", as_json=as_json, watch=watch))


def traces(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (runs/<run_id>/) or a traces.jsonl file.")],
    slowest: Annotated[int, typer.Option("--slowest", "-n", help="Waterfalls of the N slowest rollouts.")] = 3,
    width: Annotated[int, typer.Option("--width", help="Width of the waterfall's timeline, in characters.")] = 48,
    as_json: Annotated[bool, typer.Option("--json", help="Breakdown and slowest rollouts as JSON.")] = False,
) -> None:
    """Where a run's rollouts spent their time: per-hop latency and the slowest rollouts as waterfalls.

    Reads the spans `gymbus collect` wrote to runs/<run_id>/traces.jsonl (written when no OTLP endpoint
    is configured; with OTEL_EXPORTER_OTLP_ENDPOINT set, look at your trace viewer instead).
    """
    from runtime.profiling import breakdown as report

    path = run_dir / "traces.jsonl" if run_dir.is_dir() else run_dir
    if not path.is_file():
        raise UsageError(
            f"no {path}: collect writes spans there unless OTEL_EXPORTER_OTLP_ENDPOINT sends them to a collector "
            "or OTEL_SDK_DISABLED=true turns tracing off"
        )
    rollouts = report.rollouts(report.load(path))
    if not rollouts:
        raise UsageError(f"{path} holds no rollout traces")
    if as_json:
        print(json.dumps(report.as_json(rollouts, slowest), indent=2))
        return
    console.print(report.breakdown_table(report.breakdown(rollouts), len(rollouts)))
    for r in report.slowest(rollouts, slowest):
        console.print()
        console.print(report.waterfall(r, width))


def dead_letters(
    nats: NatsOpt = None,
    run_dir: RunDirOpt = None,
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's dead letters.")] = None,
    function: Annotated[str | None, typer.Option("--function", "-f", help="Only this function's.")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="Only this failure kind (worker_lost, ...).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line, payload included.")] = False,
) -> None:
    """List dead letters: messages that failed for good, with their function, kind, deliveries and error.

    Each one also ended its rollout as a failed Result. Fix the cause, then `gymbus replay` re-runs them.
    """

    async def listing(url: str) -> list[Letter]:
        from broker.connect import connection
        from runtime.engine import deadletters

        async with connection(url, name="gymbus-dead-letters") as nc:
            return await deadletters.letters(nc.jetstream(), run_id=run_id, function=function, kind=kind)

    found = with_broker(nats, run_dir, listing)
    if as_json:
        for x in found:
            sys.stdout.write(json.dumps(x.row()) + "\n")
        return
    table = Table(title=f"{len(found)} dead letter(s)")
    for col in ("seq", "function", "kind", "deliveries", "rollout", "error"):
        table.add_column(col, overflow="fold")
    for x in found:
        d = x.letter
        table.add_row(str(x.seq), d.function, d.failure_kind, str(d.num_delivered), d.session_id or "-", d.error)
    console.print(table)


def schema(
    kind: Annotated[
        str,
        typer.Argument(
            help="all, start, resume, seed, tools, verify, result, dead-letter, manifest, registration, create-params."
        ),
    ] = "all",
    env: Annotated[
        str | None,
        typer.Option("--env", help="With `start`: that environment's Start (its task fields in meta, its tools)."),
    ] = None,
    nats: NatsOpt = None,
) -> None:
    """Print the JSON Schema (draft 2020-12) of the wire messages, generated from their msgspec types.

    A task is a `start` message published to gym.agent.<agent>; any NATS client can validate against
    this schema and publish it (see the README, "Publishing from any language"). `start --env ENV`
    narrows it to one environment, from its registration on the broker (--nats) or by importing it.
    """
    from broker.wireschema import schema as wire_schema
    from broker.wireschema import start_for

    if env is not None and kind != "start":
        raise UsageError(f"--env narrows the start message, not {kind!r}: gymbus schema start --env {env}")
    try:
        if env is not None:
            from runtime.engine.registry import environment_registration

            out = start_for(run(environment_registration(env, nats)))
        else:
            out = wire_schema(kind)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
