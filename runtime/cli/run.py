"""Commands that run rollouts: collect, submit, replay."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from runtime.cli.common import NatsOpt, VerboseOpt, console, err, need_nats, run, setup_logging
from runtime.errors import UsageError

if TYPE_CHECKING:
    from runtime.engine.deadletters import Replayed

ConfigArg = Annotated[
    Path, typer.Argument(help="Run config YAML (agent, env, model, limits), e.g. configs/quickstart.yaml.")
]
InputOpt = Annotated[str | None, typer.Option("--input", "-i", help="Task JSONL (overrides the config's input).")]
LimitOpt = Annotated[int | None, typer.Option("--limit", "-n", help="Use only the first N tasks.")]
RepeatsOpt = Annotated[int | None, typer.Option("--repeats", "-r", "--num-repeats", help="Rollouts per task.")]
ExtendOpt = Annotated[
    bool, typer.Option("--extend", help="Resume with more repeats or a higher limit than the run started with.")
]
NoCheckOpt = Annotated[
    bool, typer.Option("--no-check", help="Do not ask the model endpoints for their model list before starting.")
]


def collect(
    config: ConfigArg,
    input: InputOpt = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Folder of run folders (default: runs).")] = None,
    limit: LimitOpt = None,
    repeats: RepeatsOpt = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id; an existing one resumes that run.")] = None,
    nats: NatsOpt = None,
    model_url: Annotated[
        str | None,
        typer.Option("--model-url", help="OpenAI-compatible base URL(s), comma-separated; skips the simulator."),
    ] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", help="Messages per worker at once.")] = None,
    extend: ExtendOpt = False,
    no_check: NoCheckOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Run every task x repeat through the agent and environment, gather Results, write runs/<run_id>/.

    Without --nats (or GYMBUS_NATS_URL) it starts an embedded nats-server on the run folder, one worker
    process per function, and the simulated policy when the config has no model.base_url; all are stopped
    at the end. With --nats it only submits and gathers: workers must already be running.
    Exit codes: 0 the run ended (failed rollouts included), 1 every rollout failed, 2 a usage error,
    130 interrupted (run the same command with --run-id to resume).
    """
    from runtime.runs.collect import collect as run_collect
    from runtime.runs.config import load_config
    from runtime.runs.plan import new_run_id

    setup_logging(verbose)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the local stack cleanly on SIGTERM too
    overrides = {"model.base_url": model_url, "workers.concurrency": concurrency}
    cfg = load_config(config, input=input, output=output, limit=limit, repeats=repeats, nats=nats, **overrides)
    run_id = run_id or new_run_id()
    try:
        summary = run(run_collect(cfg, run_id=run_id, quiet=quiet, extend=extend, check_model=not no_check))
    except KeyboardInterrupt:
        err.print(f"[yellow]interrupted[/]: run the same command with --run-id {run_id} to resume")
        raise typer.Exit(130) from None
    print_summary(summary)


def print_summary(summary: object) -> None:
    from runtime.profiling.tables import profile_table
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
    table.add_row("run folder", str(summary.run_dir) if summary.wrote_folder else "(written by another process)")
    console.print(table)
    if summary.profile is not None:
        console.print()
        console.print(profile_table(summary.profile))
        console.print(f"\n report  {summary.run_dir / 'report.html'}")
    if summary.all_failed:
        kinds = ", ".join(f"{k}: {v}" for k, v in summary.failures.most_common())
        err.print(f"[bold red]error:[/] every rollout failed ({kinds}); see failure_reason in rollouts.jsonl")
        raise typer.Exit(1)


def submit(
    config: ConfigArg,
    nats: NatsOpt = None,
    input: InputOpt = None,
    limit: LimitOpt = None,
    repeats: RepeatsOpt = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (default: a new one).")] = None,
    extend: ExtendOpt = False,
    no_check: NoCheckOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Publish a run's rollouts to a running broker and exit, without waiting for Results.

    Workers must be running. Rollouts that already have a Result or are in flight are not published
    again. Gather later with `gymbus collect CONFIG --nats URL --run-id RUN`, or read gym.result.<run>.
    """
    from runtime.runs.config import load_config
    from runtime.runs.submit import submit as run_submit

    setup_logging(verbose)
    cfg = load_config(config, input=input, limit=limit, repeats=repeats, nats=need_nats(nats))
    done = run(run_submit(cfg, run_id, extend=extend, check_model=not no_check))
    console.print(
        f"run {done.run_id}: submitted {done.submitted} of {done.expected} rollouts "
        f"({done.finished} already finished); gather with "
        f"`gymbus collect {config} --nats URL --run-id {done.run_id}`",
        soft_wrap=True,
    )


def replay(
    seqs: Annotated[list[int] | None, typer.Argument(help="Dead-letter seqs (from `gymbus dead-letters`).")] = None,
    nats: NatsOpt = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="Re-run within this run config's local stack (with --run).")
    ] = None,
    run_: Annotated[str | None, typer.Option("--run", help="Only this run's dead letters.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every dead letter (of --run, if given).")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Re-run the rollouts of dead letters as a new attempt, once their cause is fixed.

    With --nats, the new attempts are submitted to running workers. With --config and --run, the run's
    local stack (embedded broker, workers, policy) is started as `gymbus collect --run-id` does, the
    chosen rollouts are re-run, and runs/<run>/ is rewritten with their new Results.
    """
    setup_logging(verbose)
    if not seqs and not all_:
        raise UsageError("name dead letters by seq, or give --all")
    if config is not None:
        if not run_:
            raise UsageError("--config needs --run (the run to replay into)")
        from runtime.runs.collect import collect as run_collect
        from runtime.runs.config import load_config

        print_summary(run(run_collect(load_config(config), run_id=run_, quiet=True, replay=list(seqs or []))))
        return
    url = need_nats(nats, " (or --config with --run for a local run)")
    for done in run(_replay(url, run_, list(seqs or []), all_)):
        console.print(f"{done.seq}\t{done.session_id or '-'}\t{done.note}")


async def _replay(url: str, run_id: str | None, seqs: list[int], all_: bool) -> list[Replayed]:
    from broker.connect import connection
    from runtime.engine import deadletters

    async with connection(url, name="gymbus-replay") as nc:
        js = nc.jetstream()
        letters = await deadletters.letters(js, run_id=run_id)
        unknown = sorted(set(seqs) - {x.seq for x in letters})
        if unknown:
            have = ", ".join(str(x.seq) for x in letters) or "none"
            raise UsageError(f"no dead letter {unknown[0]} (dead letters here: {have}); see `gymbus dead-letters`")
        return await deadletters.replay(js, [x for x in letters if all_ or x.seq in seqs])
