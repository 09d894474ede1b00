"""Commands that serve until SIGTERM: worker, simulate, profiler, janitor, model serve; and init."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from runtime.cli.common import NatsOpt, VerboseOpt, console, need_nats, run, setup_logging
from runtime.engine import HTTP_PORT_ENV
from runtime.errors import UsageError
from runtime.telemetry import tracing


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
    batch: Annotated[
        int | None,
        typer.Option(
            "--batch",
            min=1,
            help="Fewest messages a pull request asks for: another is sent once this many slots are free "
            "beyond those asked for (default: a quarter of --concurrency).",
        ),
    ] = None,
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
            "--http-port", envvar=HTTP_PORT_ENV, help="Serve /metrics and /healthz on 0.0.0.0:PORT (default: off)."
        ),
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Serve one function: pull its messages from JetStream and run them, until SIGTERM (then drain).

    An agent serves gym.agent.<name> (Starts) and gym.agent.<name>.resume; an environment serves
    gym.tool.<name> and gym.verify.<name>. Run as many replicas as you like: they share one durable
    consumer per function and role.
    Spans go where the OTEL_* variables say (OTLP) or to GYMBUS_TRACES_FILE; see `gymbus traces`.
    """
    from broker import names
    from runtime.engine.worker import Worker, roles_of, serve
    from runtime.sdk import load

    setup_logging(verbose)
    url = need_nats(nats)
    try:
        fn = load(function)
    except (LookupError, ImportError) as exc:
        raise UsageError(f"FUNCTION {function!r}: {exc}") from None
    names.check(f"function {function!r} is named", fn.name)
    bad = sorted(set(role or []) - set(roles_of(fn)))
    if bad:
        raise UsageError(f"--role {bad[0]!r} is not served by {fn.name!r}; choose from {roles_of(fn)}")
    roles = [r for r in roles_of(fn) if not role or r in role]
    w = Worker(fn, nats_url=url, concurrency=concurrency, batch=batch, roles=roles, model_url=model_url)
    w.http_port = http_port
    tracing.configure(f"gymbus-{fn.name}")
    os.environ.setdefault("GYMBUS_NATS_URL", url)  # for functions that reach the broker themselves (sandbox admission)
    run(serve(w))


def simulate(
    tasks: Annotated[list[Path], typer.Option("--tasks", "-t", help="Task JSONL file(s): the answer key.")],
    port: Annotated[int, typer.Option("--port", help="Port (0: any free port; the URL is printed).")] = 8000,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    accuracy: Annotated[float, typer.Option("--accuracy", help="Probability a final answer is right.")] = 0.8,
    latency_ms: Annotated[float, typer.Option("--latency-ms", help="Delay before every answer.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    model: Annotated[str, typer.Option("--model", help="Model name it reports.")] = "policy",
    env: Annotated[
        str | None,
        typer.Option("--env", help="Environment of rows that name none: the policy plays its reference."),
    ] = None,
    reasoning: Annotated[
        str, typer.Option("--reasoning", help="Think first: none, tags (<think> in the text) or field (parsed).")
    ] = "none",
    fail_status: Annotated[int, typer.Option("--fail-status", help="FAULT: answer every call with this status.")] = 0,
    hang: Annotated[bool, typer.Option("--hang", help="FAULT: never answer a call.")] = False,
    plays: Annotated[
        list[str] | None,
        typer.Option("--plays", help="NAME=ROLE: also play model NAME as a user/tool simulator or summarizer."),
    ] = None,
) -> None:
    """Serve the SIMULATED policy: an OpenAI-compatible server that is not a model.

    It answers /v1/responses and /v1/chat/completions from the tasks' answer key with the given
    accuracy and latency, and calls a tool first when tools are offered. For demos, benchmarks and
    tests; point the config's model.base_url at a real server (vLLM, ...) for real rollouts.
    """
    from runtime.model.policy import AnswerBook
    from runtime.model.simulator import SimConfig, Simulator, load_answer_key
    from runtime.model.simulator import run as serve_simulator

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    missing = [str(t) for t in tasks if not t.is_file()]
    if missing:
        raise UsageError(f"--tasks file {missing[0]!r} does not exist")
    if reasoning not in ("none", "tags", "field"):
        raise UsageError(f"--reasoning {reasoning!r}: choose none, tags or field")
    config = SimConfig(
        accuracy=accuracy,
        latency_ms=latency_ms,
        seed=seed,
        model=model,
        reasoning=reasoning,  # type: ignore[arg-type]  # checked just above
        fail_status=fail_status,
        hang=hang,
    )
    book = AnswerBook.from_files(tasks, env=env, seed=seed)
    book.plays = _plays(plays or [])
    sim = Simulator(load_answer_key(tasks), config, book=book)
    if tracing.configure("gymbus-simulated-policy"):
        # uvicorn re-raises SIGTERM after its graceful shutdown; exit normally so buffered spans are flushed
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve_simulator(sim, host, port)


def _plays(specs: list[str]) -> dict[str, str]:
    from runtime.model.policy import ROLES

    plays = {}
    for spec in specs:
        name, _, role = spec.partition("=")
        if not name or role not in ROLES:
            raise UsageError(f"--plays {spec!r}: write NAME=ROLE, ROLE one of {', '.join(ROLES)}")
        plays[name] = role
    return plays


ProbePortOpt = Annotated[
    int | None,
    typer.Option("--http-port", envvar=HTTP_PORT_ENV, help="Serve /healthz on 0.0.0.0:PORT (default: off)."),
]


def profiler(
    nats: NatsOpt = None,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between two snapshots of a run while Results arrive.")
    ] = 0.5,
    http_port: ProbePortOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Serve the profiling consumer: fold every Result into its run's live profile, until SIGTERM.

    One durable consumer ("profiler") on gym.result.>; each run's profile is stored in the runs KV
    bucket as <run_id>.profile, read by `gymbus profile --run` and `gymbus status`. Restarts and
    redeliveries never count a Result twice (a run is a fold of its stream subject, acked only once stored).
    """
    from runtime.profiling.profiler import Profiler, serve

    setup_logging(verbose)
    run(serve(Profiler(need_nats(nats), interval_s=interval, http_port=http_port)))


def janitor(
    nats: NatsOpt = None,
    interval: Annotated[
        float | None,
        typer.Option("--interval", help="Seconds between sweeps (default: $GYMBUS_JANITOR_INTERVAL_S, else 5)."),
    ] = None,
    http_port: ProbePortOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run a janitor on its own (every worker already runs one): dead-letters messages whose delivery
    budget ran out with no worker answering (worker_lost), fails rollouts past their deadline (timeout),
    and fails messages on subjects no worker serves (invalid_input). Until SIGTERM.
    """
    setup_logging(verbose)
    run(_janitor(need_nats(nats), interval, http_port))


async def _janitor(url: str, interval: float | None, http_port: int | None) -> None:
    from broker import advisories, topology
    from broker.connect import connection
    from runtime.engine.janitor import Janitor
    from runtime.telemetry.health import HealthServer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with connection(url, name="gymbus-janitor") as nc:
        limits = topology.Limits.from_env()
        await topology.ensure(nc.jetstream(), limits)
        await advisories.ensure_consumer(nc.jetstream())  # a denial here ends it, with the reason
        health = lambda: "ok" if nc.is_connected and not stop.is_set() else "unavailable"  # noqa: E731
        probe = await HealthServer.start(health, http_port) if http_port is not None else None
        try:
            given = {"scan_interval_s": interval} if interval is not None else {}
            await Janitor.from_env(nc.jetstream(), limits, f"janitor-{os.getpid()}", **given).run(stop)
        finally:
            if probe is not None:
                await probe.stop()


def init(
    nats: NatsOpt = None,
    agent: Annotated[list[str] | None, typer.Option("--agent", help="Agent whose consumer to create.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="Environment whose consumers to create.")] = None,
) -> None:
    """Create the streams, KV buckets and the named functions' durable consumers on a broker, then exit.

    Workers do this themselves; run it first where none may be running yet (a compose init job, a
    Kubernetes Job before KEDA scales workers from zero). Idempotent.
    """
    consumers = run(_init(need_nats(nats), agent or [], env or []))
    console.print(f"broker ready: streams, buckets, consumers {', '.join(consumers) or '(none)'}")


async def _init(url: str, agents: list[str], envs: list[str]) -> list[str]:
    from broker.connect import connection
    from broker.provision import provision
    from broker.topology import Limits

    async with connection(url, name="gymbus-init") as nc:
        try:
            return await provision(nc.jetstream(), agents, envs, Limits.from_env())
        except ValueError as exc:
            raise UsageError(str(exc)) from None


model_app = typer.Typer(
    help="The model tier: serve a policy model on Ray and keep it registered in the models bucket.",
    no_args_is_help=True,
)


def model_serve(
    config: Annotated[Path, typer.Argument(help="Model deployment YAML, e.g. configs/model-serve.yaml.")],
    nats: NatsOpt = None,
    replicas: Annotated[int | None, typer.Option("--replicas", help="Replicas (overrides the config).")] = None,
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Existing Ray cluster; default: start a local one.")
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Start N replicas of vLLM (or any OpenAI-compatible server command) as Ray actors, register the
    healthy ones in the models bucket, follow restarts and deaths, and deregister on SIGTERM/SIGINT.

    Workers started without --model-url find the replicas there, live, under the config's `name`.
    """
    from runtime.model.launcher import Launcher, load_serve_config

    setup_logging(verbose)
    cfg = load_serve_config(config, replicas=replicas, ray_address=ray_address, nats=nats)
    url = need_nats(cfg.nats, ", or `nats:` in the config")

    async def serve_model() -> None:
        say = lambda line: console.print(line, markup=False, soft_wrap=True)  # noqa: E731
        await Launcher(cfg, url, say=say, handle_signals=True).run()

    run(serve_model())


def register_model_commands(guard: Callable[[Callable[..., None]], Callable[..., None]]) -> None:
    model_app.command("serve")(guard(model_serve))
