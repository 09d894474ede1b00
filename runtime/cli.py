"""The ``gymbus`` command line."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

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


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
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
    from runtime.collect import InputError
    from runtime.collect import collect as run_collect
    from runtime.config import ConfigError, load_config

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
    except (ConfigError, InputError) as exc:
        raise _fail(str(exc)) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]: run the same command with --run-id to resume")
        raise typer.Exit(130) from None
    _print_summary(summary)


def _print_summary(summary: object) -> None:
    from runtime.collect import Summary

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
        from runtime.tables import profile_table

        console.print()
        console.print(profile_table(summary.profile))
        console.print(f"\n report  {summary.run_dir / 'report.html'}")


@app.command()
def worker(
    function: Annotated[
        str, typer.Argument(help="Function to serve: a name under functions/ (math, simple_agent) or module:OBJECT.")
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
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve one function: pull its messages from JetStream and run them, until SIGTERM (then drain).

    An agent serves gym.agent.<name>; an environment serves gym.tool.<name> and gym.verify.<name>.
    Run as many replicas as you like: they share one durable consumer per subject.
    """
    from runtime.sdk import load
    from runtime.worker import Worker, roles_of, serve

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
    asyncio.run(serve(w))


@app.command()
def simulate(
    tasks: Annotated[list[Path], typer.Option("--tasks", "-t", help="Task JSONL file(s): the answer key.")],
    port: Annotated[int, typer.Option("--port", help="Port (0: any free port; the URL is printed).")] = 8000,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    accuracy: Annotated[float, typer.Option("--accuracy", help="Probability a final answer is right.")] = 0.8,
    latency_ms: Annotated[float, typer.Option("--latency-ms", help="Delay before every answer.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    model: Annotated[str, typer.Option("--model", help="Model name it reports.")] = "policy",
) -> None:
    """Serve the SIMULATED policy: an OpenAI-compatible server that is not a model.

    It answers /v1/responses and /v1/chat/completions from the tasks' answer key with the given
    accuracy and latency, and calls a tool first when tools are offered. For demos, benchmarks and
    tests; point the config's model.base_url at a real server (vLLM, ...) for real rollouts.
    """
    from runtime.simulator import SimConfig, Simulator, load_answer_key, run

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    missing = [str(t) for t in tasks if not t.is_file()]
    if missing:
        raise _fail(f"--tasks file {missing[0]!r} does not exist")
    sim = Simulator(load_answer_key(tasks), SimConfig(accuracy=accuracy, latency_ms=latency_ms, seed=seed, model=model))
    run(sim, host, port)


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
    from runtime import status as st
    from runtime.profile import ProfileError

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
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve the profiling consumer: fold every Result into its run's live profile, until SIGTERM.

    One durable consumer ("profiler") on gym.result.>; each run's profile is stored in the runs KV
    bucket as <run_id>.profile, read by `gymbus profile --run` and `gymbus status`. Restarts and
    redeliveries never count a Result twice (a run is a fold of its stream subject, acked only once stored).
    """
    from runtime.profiler import Profiler, serve

    _logging(verbose)
    if not nats:
        raise _fail("no broker: give --nats URL or set GYMBUS_NATS_URL")
    asyncio.run(serve(Profiler(nats, interval_s=interval)))


@app.command()
def status(
    nats: NatsOpt = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder of run folders (finds a running embedded broker).")
    ] = Path("runs"),
    as_json: Annotated[bool, typer.Option("--json", help="Print runs and consumers as JSON.")] = False,
) -> None:
    """Runs the broker knows (progress, mean reward, pass@1, failures, rate) and every consumer's backlog."""
    from runtime import status as st

    try:
        asyncio.run(st.show(console, nats or st.live_broker(output, None), as_json=as_json))
    except st.StatusError as exc:
        raise _fail(str(exc)) from None


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(1)


if __name__ == "__main__":
    main()
