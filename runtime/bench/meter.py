"""CPU time and memory of the stack's processes, read with psutil."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from pathlib import Path

import psutil

MB = 1024 * 1024


class Meter:
    """Watches named processes: CPU seconds (user + system), resident memory now, and its peak."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.sampled_peak: dict[str, int] = dict.fromkeys(pids, 0)
        self._task: asyncio.Task[None] | None = None

    def cpu(self) -> dict[str, float]:
        out = {}
        for name, p in self.procs.items():
            with suppress(psutil.Error):
                t = p.cpu_times()
                out[name] = t.user + t.system
        return out

    @staticmethod
    def machine_busy() -> float:
        """CPU seconds the whole machine has been busy (every process, ours and others'), all cores."""
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def rss(self) -> dict[str, int]:
        out = {}
        for name, p in self.procs.items():
            with suppress(psutil.Error):
                out[name] = p.memory_info().rss
        return out

    def peak(self) -> dict[str, int]:
        """Each process's peak resident memory: the kernel's high-water mark (Linux), else the sampled peak."""
        return {name: _high_water_mark(p.pid) or self.sampled_peak[name] for name, p in self.procs.items()}

    def start_sampling(self, interval_s: float = 0.2) -> None:
        self._task = asyncio.create_task(self._sample(interval_s))

    async def stop_sampling(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        self._take()

    def reset_sampled_peak(self) -> None:
        self.sampled_peak = dict.fromkeys(self.procs, 0)
        self._take()

    async def _sample(self, interval_s: float) -> None:
        while True:
            self._take()
            await asyncio.sleep(interval_s)

    def _take(self) -> None:
        for name, value in self.rss().items():
            self.sampled_peak[name] = max(self.sampled_peak[name], value)


def _high_water_mark(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
