"""The ``gymbus`` command line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from runtime.cli.auth import app as _auth_app
from runtime.telemetry import tracing

app = typer.Typer(
    name="gymbus",
    help=(
        "Run RLVR rollouts as stateless functions on NATS JetStream.\n\n"
        "Start with `gymbus collect configs/quickstart.yaml`: it starts an embedded broker, the workers "
        "and (unless a model URL is configured) a simulated policy, runs every task x repeat, and writes "
        "runs/<run_id>/. Re-running with the same --run-id resumes."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True)

NatsOpt = Annotated[
    str | None,
    typer.Option("--nats", envvar="GYMBUS_NATS_URL", help="Broker URL, e.g. nats://127.0.0.1:4222."),
]


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO if os.environ.get("GYMBUS_LOG") == "info" else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _event_loop_run(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run, or uvloop's when GYMBUS_UVLOOP=1 (opt-in; `pip install uvloop`)."""
    if os.environ.get("GYMBUS_UVLOOP") == "1":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(2)


@app.command()
def collect(
    config: Annotated[
        Path, typer.Argument(help="Run config YAML (agent, env, model, limits), e.g. configs/quickstart.yaml.")
    ],
    input: Annotated[
        str | None, typer.Option("--input", "-i", help="Task JSONL (overrides the config's input).")
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Folder for run folders (default: runs).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", help="Use only the first N tasks.")] = None,
    repeats: Annotated[int | None, typer.Option("--repeats", "-r", "--num-repeats", help="Rollouts per task.")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id; an existing one resumes that run.")] = None,
    nats: NatsOpt = None,
    model_url: Annotated[
        str | None,
        typer.Option("--model-url", help="OpenAI-compatible base URL(s), comma-separated; skips the simulator."),
    ] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", help="Messages per worker at once.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run every task x repeat through the agent and environment, gather Results, write runs/<run_id>/.

    Without --nats (or GYMBUS_NATS_URL) it starts an embedded nats-server on the run folder, one worker
    process per function, and the simulated policy when the config has no model.base_url; all are stopped
    at the end. With --nats it only submits and gathers: workers must already be running.
    """
    from runtime.runs.collect import InputError
    from runtime.runs.collect import collect as run_collect
    from runtime.runs.config import ConfigError, load_config

    _logging(verbose)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the local stack cleanly on SIGTERM too
    try:
        cfg = load_config(
            config,
            input=input,
            output=output,
            limit=limit,
            repeats=repeats,
            nats=nats,
            **{"model.base_url": model_url, "workers.concurrency": concurrency},
        )
        summary = asyncio.run(run_collect(cfg, run_id=run_id, quiet=quiet))
    except (ConfigError, InputError, tracing.TracingError) as exc:
        raise _fail(str(exc)) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]: run the same command with --run-id to resume")
        raise typer.Exit(130) from None
    _print_summary(summary)


def _print_summary(summary: object) -> None:
    from runtime.runs.collect import Summary

    assert isinstance(summary, Summary)
    n = len(summary.results)
    failed = sum(summary.failures.values())
    table = Table(title=f"run {summary.run_id}", show_header=False, box=None)
    table.add_row("rollouts", f"{n} / {summary.expected}  ({summary.submitted} submitted this time)")
    mean = summary.mean_reward
    table.add_row("mean reward", "-" if mean is None else f"{mean:.3f}  (over {n - failed} scored)")
    table.add_row("failures", ", ".join(f"{k}: {v}" for k, v in summary.failures.most_common()) or "0")
    table.add_row("wall time", f"{summary.wall_s:.1f} s")
    table.add_row("run folder", str(summary.run_dir))
    console.print(table)
    if summary.profile is not None:
        from runtime.profiling.tables import profile_table

        console.print()
        console.print(profile_table(summary.profile))
        console.print(f"\n report  {summary.run_dir / 'report.html'}")


@app.command()
def worker(
    function: Annotated[
        str,
        typer.Argument(
            envvar="GYMBUS_FUNCTION",
            help="Function to serve: a name under functions/ (math, simple_agent) or module:OBJECT.",
        ),
    ],
    nats: NatsOpt = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", help="Messages handled at once, per subject served.")
    ] = 64,
    batch: Annotated[int, typer.Option("--batch", help="Messages fetched per pull request.")] = 32,
    role: Annotated[
        list[str] | None,
        typer.Option("--role", help="Serve only these roles: agent, tool, verify (default: all of the function's)."),
    ] = None,
    model_url: Annotated[
        str | None,
        typer.Option(
            "--model-url", envvar="GYMBUS_MODEL_URL", help="Static model base URL(s); default: the models KV bucket."
        ),
    ] = None,
    http_port: Annotated[
        int | None,
        typer.Option(
            "--http-port", envvar="GYMBUS_HTTP_PORT", help="Serve /metrics and /healthz on 0.0.0.0:PORT (default: off)."
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve one function: pull its messages from JetStream and run them, until SIGTERM (then drain).

    An agent serves gym.agent.<name>; an environment serves gym.tool.<name> and gym.verify.<name>.
    Run as many replicas as you like: they share one durable consumer per subject.
    Spans go where the OTEL_* variables say (OTLP) or to GYMBUS_TRACES_FILE; see `gymbus traces`.
    """
    from runtime.engine.worker import Worker, roles_of, serve
    from runtime.sdk import load

    _logging(verbose)
    if not nats:
        raise _fail("no broker: give --nats URL or set GYMBUS_NATS_URL")
    try:
        fn = load(function)
    except (LookupError, ImportError) as exc:
        raise _fail(str(exc)) from None
    roles = role or roles_of(fn)
    bad = sorted(set(roles) - set(roles_of(fn)))
    if bad:
        raise _fail(f"--role {bad[0]!r} is not served by {fn.name!r}; choose from {roles_of(fn)}")
    w = Worker(fn, nats_url=nats, concurrency=concurrency, batch=batch, roles=roles, model_url=model_url)  # type: ignore[arg-type]
    w.http_port = http_port
    try:
        tracing.configure(f"gymbus-{fn.name}")
    except tracing.TracingError as exc:
        raise _fail(str(exc)) from None
    _event_loop_run(serve(w))


@app.command()
def simulate(
    tasks: Annotated[list[Path], typer.Option("--tasks", "-t", help="Task JSONL file(s): the answer key.")],
    port: Annotated[int, typer.Option("--port", help="Port (0: any free port; the URL is printed).")] = 8000,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    accuracy: Annotated[float, typer.Option("--accuracy", help="Probability a final answer is right.")] = 0.8,
    latency_ms: Annotated[float, typer.Option("--latency-ms", help="Delay before every answer.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    model: Annotated[str, typer.Option("--model", help="Model name it reports.")] = "policy",
    reasoning: Annotated[
        str, typer.Option("--reasoning", help="Think first: none, tags (<think> in the text) or field (parsed).")
    ] = "none",
    fail_status: Annotated[int, typer.Option("--fail-status", help="FAULT: answer every call with this status.")] = 0,
    hang: Annotated[bool, typer.Option("--hang", help="FAULT: never answer a call.")] = False,
) -> None:
    """Serve the SIMULATED policy: an OpenAI-compatible server that is not a model.

    It answers /v1/responses and /v1/chat/completions from the tasks' answer key with the given
    accuracy and latency, and calls a tool first when tools are offered. For demos, benchmarks and
    tests; point the config's model.base_url at a real server (vLLM, ...) for real rollouts.
    """
    from runtime.model.simulator import SimConfig, Simulator, load_answer_key, run

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    missing = [str(t) for t in tasks if not t.is_file()]
    if missing:
        raise _fail(f"--tasks file {missing[0]!r} does not exist")
    if reasoning not in ("none", "tags", "field"):
        raise _fail(f"--reasoning {reasoning!r}: choose none, tags or field")
    config = SimConfig(
        accuracy=accuracy,
        latency_ms=latency_ms,
        seed=seed,
        model=model,
        reasoning=reasoning,  # type: ignore[arg-type]
        fail_status=fail_status,
        hang=hang,
    )
    sim = Simulator(load_answer_key(tasks), config)
    if tracing.configure("gymbus-simulated-policy"):
        # uvicorn re-raises SIGTERM after its graceful shutdown; exit normally so buffered spans are flushed
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run(sim, host, port)


model_app = typer.Typer(
    help="The model tier: serve a policy model on Ray and keep it registered in the models bucket.",
    no_args_is_help=True,
)
app.add_typer(model_app, name="model")
app.add_typer(_auth_app, name="auth")


@model_app.command("serve")
def model_serve(
    config: Annotated[Path, typer.Argument(help="Model deployment YAML, e.g. configs/model-serve.yaml.")],
    nats: NatsOpt = None,
    replicas: Annotated[int | None, typer.Option("--replicas", help="Replicas (overrides the config).")] = None,
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Existing Ray cluster; default: start a local one.")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Start N replicas of vLLM (or any OpenAI-compatible server command) as Ray actors, register the
    healthy ones in the models bucket, follow restarts and deaths, and deregister on SIGTERM/SIGINT.

    Workers started without --model-url find the replicas there, live, under the config's `name`.
    """
    from runtime.model.launcher import Launcher, load_serve_config
    from runtime.runs.config import ConfigError

    _logging(verbose)
    try:
        cfg = load_serve_config(config, replicas=replicas, ray_address=ray_address, nats=nats)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    if not cfg.nats:
        raise _fail("no broker: give --nats URL, set GYMBUS_NATS_URL, or `nats:` in the config")

    async def serve_model() -> None:
        say = lambda line: console.print(line, markup=False, soft_wrap=True)  # noqa: E731
        await Launcher(cfg, cfg.nats or "", say=say, handle_signals=True).run()

    try:
        asyncio.run(serve_model())
    except ConfigError as exc:
        raise _fail(str(exc)) from None


@app.command()
def init(
    nats: NatsOpt = None,
    agent: Annotated[list[str] | None, typer.Option("--agent", help="Agent whose consumer to create.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="Environment whose consumers to create.")] = None,
) -> None:
    """Create the streams, KV buckets and the named functions' durable consumers on a broker, then exit.

    Workers do this themselves; run it first where none may be running yet (a compose init job, a
    Kubernetes Job before KEDA scales workers from zero). Idempotent.
    """
    from broker.connect import connect
    from broker.provision import provision
    from broker.topology import Limits

    if not nats:
        raise _fail("no broker: give --nats URL or set GYMBUS_NATS_URL")

    async def run() -> list[str]:
        nc = await connect(nats, name="gymbus-init")
        try:
            return await provision(nc.jetstream(), agent or [], env or [], Limits.from_env())
        finally:
            await nc.close()

    try:
        consumers = asyncio.run(run())
    except ValueError as exc:
        raise _fail(str(exc)) from None
    console.print(f"broker ready: streams, buckets, consumers {', '.join(consumers) or '(none)'}")


@app.command()
def submit(
    config: Annotated[Path, typer.Argument(help="Run config YAML (agent, env, model, limits).")],
    nats: NatsOpt = None,
    input: Annotated[str | None, typer.Option("--input", "-i", help="Task JSONL (overrides the config's).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", help="Use only the first N tasks.")] = None,
    repeats: Annotated[int | None, typer.Option("--repeats", "-r", "--num-repeats", help="Rollouts per task.")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (default: a new one).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Publish a run's rollouts to a running broker and exit, without waiting for Results.

    Workers must be running. Rollouts that already have a Result or are in flight are not published
    again. Gather later with `gymbus collect CONFIG --nats URL --run-id RUN`, or read gym.result.<run>.
    """
    from runtime.runs.collect import InputError
    from runtime.runs.config import ConfigError, load_config
    from runtime.runs.submit import submit as run_submit

    _logging(verbose)
    try:
        cfg = load_config(config, input=input, limit=limit, repeats=repeats, nats=nats)
        done = asyncio.run(run_submit(cfg, run_id))
    except (ConfigError, InputError) as exc:
        raise _fail(str(exc)) from None
    console.print(
        f"run {done.run_id}: submitted {done.submitted} of {done.expected} rollouts "
        f"({done.finished} already finished); gather with "
        f"`gymbus collect {config} --nats URL --run-id {done.run_id}`",
        soft_wrap=True,
    )


@app.command()
def schema(
    kind: Annotated[
        str, typer.Argument(help="all, start, resume, seed, tools, verify, result or dead-letter.")
    ] = "all",
) -> None:
    """Print the JSON Schema (draft 2020-12) of the wire messages, generated from their msgspec types.

    A task is a `start` message published to gym.agent.<agent>; any NATS client can validate against
    this schema and publish it (see the README for a `nats pub` example).
    """
    import json

    from broker.wireschema import schema as wire_schema

    try:
        sys.stdout.write(json.dumps(wire_schema(kind), indent=2) + "\n")
    except KeyError as exc:
        raise _fail(str(exc.args[0])) from None


@app.command()
def traces(
    run: Annotated[Path, typer.Argument(help="A run folder (runs/<run_id>/) or a traces.jsonl file.")],
    slowest: Annotated[int, typer.Option("--slowest", "-n", help="Waterfalls of the N slowest rollouts.")] = 3,
    width: Annotated[int, typer.Option("--width", help="Width of the waterfall's timeline, in characters.")] = 48,
    as_json: Annotated[bool, typer.Option("--json", help="Breakdown and slowest rollouts as JSON.")] = False,
) -> None:
    """Where a run's rollouts spent their time: per-hop latency and the slowest rollouts as waterfalls.

    Reads the spans `gymbus collect` wrote to runs/<run_id>/traces.jsonl (written when no OTLP endpoint
    is configured; with OTEL_EXPORTER_OTLP_ENDPOINT set, look at your trace viewer instead).
    """
    import json

    from runtime.telemetry import breakdown as report

    path = run / "traces.jsonl" if run.is_dir() else run
    if not path.is_file():
        raise _fail(
            f"no {path}: collect writes spans there unless OTEL_EXPORTER_OTLP_ENDPOINT sends them to a collector "
            "or OTEL_SDK_DISABLED=true turns tracing off"
        )
    rollouts = report.rollouts(report.load(path))
    if not rollouts:
        raise _fail(f"{path} holds no rollout traces")
    if as_json:
        print(json.dumps(report.as_json(rollouts, slowest), indent=2))
        return
    console.print(report.breakdown_table(report.breakdown(rollouts), len(rollouts)))
    for r in report.slowest(rollouts, slowest):
        console.print()
        console.print(report.waterfall(r, width))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def bench(ctx: typer.Context) -> None:
    """Measure gymbus's own overhead on the real stack with the simulated policy (`gymbus bench --help`)."""
    from runtime.bench.cli import main as bench_main

    bench_main(ctx.args, prog_name="gymbus bench")


@app.command()
def profile(
    run_dir: Annotated[
        Path | None, typer.Argument(help="A run folder, e.g. runs/<run_id>/: profiled offline, no broker needed.")
    ] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="A run id: its live profile, as the profiler last stored it.")
    ] = None,
    nats: NatsOpt = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder of run folders (finds a running embedded broker).")
    ] = Path("runs"),
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
    from runtime.profiling.profile import ProfileError

    if (run_dir is None) == (run is None):
        raise _fail("give a run folder (offline) or --run RUN_ID (live), not both")
    if run is not None and pass_threshold is not None:
        raise _fail("--pass-threshold applies to offline profiles; a live one uses the run's config")
    try:
        if run_dir is not None:
            st.offline(console, run_dir, pass_threshold, as_json=as_json, write=write)
        else:
            asyncio.run(st.live(console, nats or st.live_broker(output, run), run or "", as_json=as_json, watch=watch))
    except (ProfileError, st.StatusError) as exc:
        raise _fail(str(exc)) from None


@app.command()
def profiler(
    nats: NatsOpt = None,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between two snapshots of a run while Results arrive.")
    ] = 0.5,
    http_port: Annotated[
        int | None,
        typer.Option("--http-port", envvar="GYMBUS_HTTP_PORT", help="Serve /healthz on 0.0.0.0:PORT (default: off)."),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve the profiling consumer: fold every Result into its run's live profile, until SIGTERM.

    One durable consumer ("profiler") on gym.result.>; each run's profile is stored in the runs KV
    bucket as <run_id>.profile, read by `gymbus profile --run` and `gymbus status`. Restarts and
    redeliveries never count a Result twice (a run is a fold of its stream subject, acked only once stored).
    """
    from runtime.profiling.profiler import Profiler, serve

    _logging(verbose)
    if not nats:
        raise _fail("no broker: give --nats URL or set GYMBUS_NATS_URL")
    asyncio.run(serve(Profiler(nats, interval_s=interval, http_port=http_port)))


@app.command()
def status(
    nats: NatsOpt = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder of run folders (finds a running embedded broker).")
    ] = Path("runs"),
    as_json: Annotated[bool, typer.Option("--json", help="Print runs and consumers as JSON.")] = False,
) -> None:
    """Runs the broker knows (progress, mean reward, pass@1, failures, rate) and every consumer's backlog."""
    from runtime.profiling import status as st

    try:
        asyncio.run(st.show(console, nats or st.live_broker(output, None), as_json=as_json))
    except st.StatusError as exc:
        raise _fail(str(exc)) from None


RunDirOpt = Annotated[
    Path | None,
    typer.Option("--run-dir", help="A run folder of `gymbus collect` (its embedded broker is started to read it)."),
]


@app.command("dead-letters")
def dead_letters(
    nats: NatsOpt = None,
    run_dir: RunDirOpt = None,
    run: Annotated[str | None, typer.Option("--run", help="Only this run's dead letters.")] = None,
    function: Annotated[str | None, typer.Option("--function", "-f", help="Only this function's.")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="Only this failure kind (worker_lost, ...).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line, payload included.")] = False,
) -> None:
    """List dead letters: messages that failed for good, with their function, kind, deliveries and error.

    Each one also ended its rollout as a failed Result. Fix the cause, then `gymbus replay` re-runs them.
    """
    from runtime.engine import deadletters

    async def listing(url: str) -> list[deadletters.Letter]:
        from broker.connect import connect

        nc = await connect(url, name="gymbus-dead-letters")
        try:
            return await deadletters.letters(nc.jetstream(), run_id=run, function=function, kind=kind)
        finally:
            await nc.close()

    found = _with_broker(nats, run_dir, listing)
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


@app.command()
def replay(
    seqs: Annotated[list[int] | None, typer.Argument(help="Dead-letter seqs (from `gymbus dead-letters`).")] = None,
    nats: NatsOpt = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="Re-run within this run config's local stack (with --run).")
    ] = None,
    run: Annotated[str | None, typer.Option("--run", help="Only this run's dead letters.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every dead letter (of --run, if given).")] = False,
) -> None:
    """Re-run the rollouts of dead letters as a new attempt, once their cause is fixed.

    With --nats, the new attempts are submitted to running workers. With --config and --run, the run's
    local stack (embedded broker, workers, policy) is started as `gymbus collect --run-id` does, the
    chosen rollouts are re-run, and runs/<run>/ is rewritten with their new Results.
    """
    if not seqs and not all_:
        raise _fail("name dead letters by seq, or give --all")
    if config is not None:
        if not run:
            raise _fail("--config needs --run (the run to replay into)")
        from runtime.runs.collect import collect as run_collect
        from runtime.runs.config import load_config

        summary = asyncio.run(run_collect(load_config(config), run_id=run, quiet=True, replay=list(seqs or [])))
        _print_summary(summary)
        return
    if not nats:
        raise _fail("no broker: give --nats URL (or --config with --run for a local run)")
    from runtime.engine import deadletters

    async def submit(url: str) -> list[deadletters.Replayed]:
        from broker.connect import connect

        nc = await connect(url, name="gymbus-replay")
        try:
            js = nc.jetstream()
            chosen = [x for x in await deadletters.letters(js, run_id=run) if all_ or x.seq in (seqs or [])]
            return await deadletters.replay(js, chosen)
        finally:
            await nc.close()

    for done in asyncio.run(submit(nats)):
        console.print(f"{done.seq}\t{done.session_id or '-'}\t{done.note}")


@app.command()
def janitor(
    nats: NatsOpt = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between deadline sweeps.")] = 5.0,
    http_port: Annotated[
        int | None,
        typer.Option("--http-port", envvar="GYMBUS_HTTP_PORT", help="Serve /healthz on 0.0.0.0:PORT (default: off)."),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run a janitor on its own (every worker already runs one): dead-letters messages whose delivery
    budget ran out with no worker answering (worker_lost), fails rollouts past their deadline (timeout),
    and fails messages on subjects no worker serves (invalid_input). Until SIGTERM.
    """
    from broker import advisories, topology
    from broker.connect import connect
    from broker.denials import PermissionDenied
    from runtime.engine.janitor import Janitor
    from runtime.telemetry.health import HealthServer

    _logging(verbose)
    if not nats:
        raise _fail("no broker: give --nats URL or set GYMBUS_NATS_URL")

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        nc = await connect(nats, name="gymbus-janitor")
        probe = None
        try:
            limits = topology.Limits.from_env()
            await topology.ensure(nc.jetstream(), limits)
            await advisories.ensure_consumer(nc.jetstream())  # a denial here ends it, with the reason
            if http_port is not None:
                health = lambda: "ok" if nc.is_connected and not stop.is_set() else "unavailable"  # noqa: E731
                probe = await HealthServer.start(health, http_port)
            await Janitor(nc.jetstream(), limits, holder=f"janitor-{os.getpid()}", scan_interval_s=interval).run(stop)
        finally:
            if probe is not None:
                await probe.stop()
            await nc.close()

    try:
        asyncio.run(serve())
    except PermissionDenied as exc:
        raise _fail(str(exc)) from None


def _with_broker(nats: str | None, run_dir: Path | None, fn: Any) -> Any:
    """Run ``fn(url)`` against --nats, or against a run folder's embedded broker started for the purpose."""
    if nats:
        return asyncio.run(fn(nats))
    if run_dir is None:
        raise _fail("no broker: give --nats URL or --run-dir runs/<run_id>")
    if not (run_dir / "broker").is_dir():
        raise _fail(f"{run_dir} has no broker/ folder: not a run folder of `gymbus collect`")
    from broker.server import EmbeddedServer

    with EmbeddedServer(run_dir / "broker", log_file=run_dir / "logs" / "nats-server.log") as broker:
        return asyncio.run(fn(broker.url))


def main() -> None:
    from broker.denials import PermissionDenied

    try:
        app()
    except BrokenPipeError:
        sys.exit(1)
    except PermissionDenied as exc:  # an identity used for a job it is not allowed (broker/auth.py)
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        sys.exit(2)


if __name__ == "__main__":
    main()
