"""py-spy attached to worker processes during the measured window (optional: needs py-spy and ptrace).

Each worker's samples land in ``<name>.txt`` as collapsed stacks (py-spy's ``raw`` format: one line
per stack, frames joined by ``;``, then the sample count), which `runtime.bench.flame` summarizes. Only
samples of a thread holding the GIL are kept (``--gil``): the profile is where Python time goes;
time in syscalls (socket writes, epoll) is in the process CPU figures, not here.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("gymbus.bench")


class Profiler:
    def __init__(self, folder: Path, pids: dict[str, int], rate_hz: int = 250) -> None:
        self.folder = folder
        self.pids = pids
        self.rate_hz = rate_hz
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        beside = Path(sys.executable).parent / "py-spy"
        exe = str(beside) if beside.exists() else shutil.which("py-spy")
        if exe is None:
            log.warning("py-spy is not installed (pip install -e '.[bench]'): no profile recorded")
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, pid in self.pids.items():
            cmd = [exe, "record", "--pid", str(pid), "--rate", str(self.rate_hz), "--nonblocking", "--gil"]
            cmd += ["--format", "raw", "--output", str(self.folder / f"{name}.txt")]
            log_file = open(self.folder / f"{name}.py-spy.log", "wb")
            self._procs[name] = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        for proc in self._procs.values():
            proc.send_signal(signal.SIGINT)
        for name, proc in self._procs.items():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log.warning("py-spy on %s did not stop; killed", name)
                proc.kill()

    def files(self) -> dict[str, str]:
        return {name: str(self.folder / f"{name}.txt") for name in self._procs}
