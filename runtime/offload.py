"""CPU-heavy verifier work off the worker's event loop, bounded in time.

``await offload(fn, *args, timeout_s=10)`` runs a plain (picklable, module-level) function in a small
pool of spawned processes, so a slow SQL query, a sympy simplification or an IFEval check never
blocks the loop that keeps every other message of the worker moving. At most ``GYMBUS_OFFLOAD_WORKERS``
calls run at once per worker process (default 2); the others wait for a slot, and their time starts
when they get one. A call that runs past ``timeout_s`` is a ``verifier_error`` (`VerifierTimeout`,
never retried): its process is killed (a thread could not be), the pool is started again, and the
calls that shared the pool are run again on the new one.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

from runtime.errors import VerifierError

T = TypeVar("T")


class VerifierTimeout(VerifierError):
    """Verifier work ran past its time bound (retrying cannot help)."""

    retry = False


class OffLoop:
    """The process pool of one worker process (created on first use)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or int(os.environ.get("GYMBUS_OFFLOAD_WORKERS", "2"))
        self._pool: ProcessPoolExecutor | None = None
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._generation = 0
        self._warm: list[Any] = []
        self._modules: set[str] = set()

    def _executor(self) -> tuple[ProcessPoolExecutor, Any]:
        """The pool, and a future that is done once its processes have started (a call's time starts then)."""
        if self._pool is None:
            paths = [os.getcwd(), str(Path(__file__).resolve().parent.parent), *sys.path]
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=_import_paths, initargs=(paths,)
            )
            self._warm = [self._pool.submit(_ready) for _ in range(self.workers)]
            self._modules = set()
        return self._pool, self._warm

    async def run(self, fn: Callable[..., T], *args: Any, timeout_s: float) -> T:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.workers))
        async with self._slots[1]:
            for _ in range(3):
                generation = self._generation
                pool, warm = self._executor()
                await asyncio.gather(*(asyncio.wrap_future(f) for f in warm), return_exceptions=True)
                module = getattr(fn, "__module__", None)
                if module and module not in self._modules:  # its import is not the call's time
                    self._modules.add(module)
                    imports = [pool.submit(importlib.import_module, module) for _ in range(self.workers)]
                    await asyncio.gather(*(asyncio.wrap_future(f) for f in imports), return_exceptions=True)
                future = asyncio.wrap_future(pool.submit(fn, *args))
                try:
                    return await asyncio.wait_for(future, timeout_s)
                except TimeoutError:
                    self._restart(generation)
                    name = getattr(fn, "__qualname__", repr(fn))
                    raise VerifierTimeout(f"{name} ran past its bound of {timeout_s:g} s (timeout)") from None
                except BrokenProcessPool:
                    if generation == self._generation:  # not our own restart: the pool died by itself
                        self._restart(generation)
            raise VerifierError(f"the verifier's process pool broke three times running {fn!r}")

    def _restart(self, generation: int) -> None:
        """Kill the pool's processes (once per generation) so the next call gets a fresh pool."""
        if generation != self._generation or self._pool is None:
            return
        self._generation += 1
        pool, self._pool = self._pool, None
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _ready() -> bool:
    return True


def _import_paths(paths: list[str]) -> None:
    """In a pool process: import what the worker imports (its working directory, the repository, its
    path), and the SDK every environment module imports."""
    sys.path[:0] = [p for p in dict.fromkeys(paths) if p not in sys.path]
    importlib.import_module("runtime.sdk")


_OFF_LOOP = OffLoop()


async def offload(fn: Callable[..., T], *args: Any, timeout_s: float = 10.0) -> T:
    """Run ``fn(*args)`` in the worker's verifier process pool, at most ``timeout_s`` seconds.
    ``GYMBUS_OFFLOAD_INLINE=1`` runs it on the caller's thread instead, unbounded (for measuring a
    verifier's CPU in one process: ``python -m runtime.bench.verifiers``)."""
    if os.environ.get("GYMBUS_OFFLOAD_INLINE") == "1":
        return fn(*args)
    return await _OFF_LOOP.run(fn, *args, timeout_s=timeout_s)
