"""Commands for training: ``gymbus reverify``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from runtime.cli.common import NatsOpt, VerboseOpt, console, setup_logging, with_broker


def reverify(
    run_dir: Annotated[Path, typer.Argument(help="A run folder of `gymbus collect` (runs/<run_id>).")],
    env: Annotated[str | None, typer.Option("--env", help="Verify with this environment (default: the run's).")] = None,
    into: Annotated[str | None, typer.Option("--into", help="Run id of the new Results (default: <run>-rv).")] = None,
    nats: NatsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per rollout, then a summary.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Score a run's stored rollouts again with the current verifier, without generating anything.

    The new Results go to gym.result.<into> on the run's broker (its embedded one, or --nats); the
    rewards before and after are printed, and kept in <run_dir>/reverify-<into>.jsonl.
    """
    from runtime.trainer.reverify import reverify as do_reverify

    setup_logging(verbose)
    done = with_broker(nats, run_dir, lambda url: do_reverify(run_dir, url, env, into))
    if as_json:
        for c in done.changes:
            print(json.dumps(c.__dict__))
    before, after = done.mean("before"), done.mean("after")
    console.print(f"reverified {len(done.changes)} rollouts of {done.run_id} into gym.result.{done.into}")
    console.print(f" changed     {len(done.changed)}   (skipped {done.skipped} that never reached a verifier)")
    console.print(f" mean reward {_fmt(before)} -> {_fmt(after)}")
    for c in done.changed[:20]:
        console.print(f"  task {c.task_index} rollout {c.rollout_index}: {_fmt(c.before)} -> {_fmt(c.after)} {c.error}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
