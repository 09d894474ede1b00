"""Live progress of a run: a rich progress bar on a terminal, plain periodic lines elsewhere (CI, logs)."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from broker.schemas import Result
from runtime.runs.feed import Done


class RunProgress:
    def __init__(self, total: int, run_id: str, *, quiet: bool = False, console: Console | None = None) -> None:
        self.total = total
        self.run_id = run_id
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        self.done = 0
        self.resumed = 0
        self.scored = 0
        self.reward_sum = 0.0
        self.failures: Counter[str] = Counter()
        self.t0 = time.monotonic()
        self._last_line = 0.0
        self.live = self.console.is_terminal and not os.environ.get("CI")
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            disable=quiet or not self.live,
        )
        self._task = self._progress.add_task(f"run {run_id}", total=total, rate="", stats="")

    def add(self, r: Result | Done, resumed: bool = False) -> None:
        self.done += 1
        self.resumed += resumed
        if r.reward is not None:
            self.scored += 1
            self.reward_sum += r.reward
        if r.failure_kind:
            self.failures[r.failure_kind] += 1
        self.refresh()

    def stats(self) -> str:
        mean = f"reward {self.reward_sum / self.scored:.3f}" if self.scored else "reward -"
        return f"{mean} · failed {sum(self.failures.values())}"

    def refresh(self) -> None:
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        rate = f"{(self.done - self.resumed) / elapsed:.1f} rollouts/s"
        self._progress.update(self._task, completed=self.done, rate=rate, stats=self.stats())
        if not self.live and not self.quiet:
            now = time.monotonic()
            final = self.done == self.total and self._last_line != float("inf")
            if now - self._last_line >= 5 or final:
                self._last_line = float("inf") if final else now
                print(
                    f"[{self.run_id}] {self.done}/{self.total} rollouts · {rate} · {self.stats()}",
                    file=sys.stderr,
                    flush=True,
                )

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.refresh()
        self._progress.stop()
