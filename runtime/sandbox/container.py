"""The ``docker`` backend: a throwaway container per run, through the ``docker`` SDK (optional extra).

The container has no network (``network_mode=none``), a read-only root, tmpfs /work and /tmp of the
file size limit, memory (and swap) and pids limits, one CPU, CPU/file-size/open-files ulimits, all
capabilities dropped, ``no-new-privileges``, the unprivileged uid 65534 and no log driver.
Nothing is copied into it: the files, the command and stdin travel on its stdin as one JSON line,
which a few lines of Python inside unpack into /work before running the command with an empty
environment. It works against any engine the SDK reaches (DOCKER_HOST, or ``docker_url``), also a
remote one. The image must already be on the engine (``python:3.11-slim`` by default).
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
import time
from typing import Any

from runtime.errors import SandboxError
from runtime.sandbox.config import SandboxConfig
from runtime.sandbox.job import Job
from runtime.sandbox.outcome import Outcome, Verdict, classify

BOOT = (
    "import base64,json,os,shutil,sys\n"
    "h=json.loads(sys.stdin.buffer.readline())\n"
    "for n,c in h['files'].items():\n"
    " p=os.path.join('/work',n);os.makedirs(os.path.dirname(p),exist_ok=True)\n"
    " open(p,'wb').write(base64.b64decode(c))\n"
    "open('/tmp/.stdin','wb').write(base64.b64decode(h['stdin']))\n"
    "fd=os.open('/tmp/.stdin',os.O_RDONLY);os.dup2(fd,0);os.close(fd);os.unlink('/tmp/.stdin')\n"
    "a=h['argv'];x=shutil.which(a[0]) or a[0];pid=os.fork()\n"
    "if pid==0:os.chdir('/work');os.execve(x,a,{})\n"
    "s=os.waitpid(pid,0)[1];os._exit(128+os.WTERMSIG(s) if os.WIFSIGNALED(s) else os.WEXITSTATUS(s))\n"
)
"""PID 1 of the container: unpacks the files and stdin, runs the command as its child in /work (a
``working_dir`` would reset the tmpfs's mode; PID 1 itself would be spared the CPU limit's signals)
and exits with its status (128 + N for signal N)."""
LABEL = "gymbus.sandbox"


class DockerBackend:
    name = "docker"

    def __init__(self, config: SandboxConfig) -> None:
        try:
            import docker
        except ImportError as exc:
            raise SandboxError("the docker backend needs the docker SDK: pip install 'gymbus[docker]'") from exc
        self.config = config
        self.docker = docker
        try:
            self.client = docker.DockerClient(base_url=config.docker_url) if config.docker_url else docker.from_env()
            self.client.ping()
        except Exception as exc:
            raise SandboxError(f"the docker backend cannot reach a Docker engine: {exc}") from exc
        try:
            self.client.images.get(config.docker_image)
        except docker.errors.ImageNotFound:
            raise SandboxError(
                f"image {config.docker_image!r} is not on the Docker engine: docker pull {config.docker_image}"
            ) from None
        except Exception as exc:
            raise SandboxError(f"the docker backend cannot inspect image {config.docker_image!r}: {exc}") from exc

    async def run(self, job: Job) -> Outcome:
        return await asyncio.to_thread(self._run, job)

    def _create(self, job: Job) -> str:
        lim = job.limits
        size = f"rw,nosuid,nodev,size={lim.file_mb}m,mode=1777"
        Ulimit = self.docker.types.Ulimit
        api = self.client.api
        host = api.create_host_config(
            network_mode="none",
            read_only=True,
            tmpfs={"/work": size, "/tmp": size},
            mem_limit=f"{lim.memory_mb}m",
            memswap_limit=f"{lim.memory_mb}m",
            pids_limit=lim.processes,
            nano_cpus=1_000_000_000,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=[
                Ulimit(name="cpu", soft=lim.cpu_s, hard=lim.cpu_s + 1),
                Ulimit(name="fsize", soft=lim.file_mb * 1024 * 1024, hard=lim.file_mb * 1024 * 1024),
                Ulimit(name="nofile", soft=lim.open_files, hard=lim.open_files),
                Ulimit(name="core", soft=0, hard=0),
            ],
            log_config=self.docker.types.LogConfig(type="none"),
        )
        created = api.create_container(
            self.config.docker_image,
            command=[self.config.docker_python, "-E", "-s", "-B", "-c", BOOT],
            stdin_open=True,  # and, not detached, StdinOnce: our half-close ends its stdin
            user="65534:65534",
            environment={},
            network_disabled=True,
            labels={LABEL: "1"},
            host_config=host,
        )
        return str(created["Id"])

    def _run(self, job: Job) -> Outcome:
        try:
            container = self._create(job)
        except Exception as exc:
            raise SandboxError(f"docker sandbox could not create a container: {exc}") from exc
        try:
            return self._attached(container, job)
        finally:
            try:
                self.client.api.remove_container(container, force=True)
            except Exception:
                pass  # gone already; labelled gymbus.sandbox for a sweep if not

    def _attached(self, container: str, job: Job) -> Outcome:
        lim = job.limits
        api = self.client.api
        try:
            sock = api.attach_socket(container, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            raw: socket.socket = getattr(sock, "_sock", sock)
            api.start(container)
        except Exception as exc:
            raise SandboxError(f"docker sandbox could not start its container: {exc}") from exc
        started = time.monotonic()
        deadline = started + lim.wall_s
        header = {
            "files": {n: base64.b64encode(c).decode() for n, c in job.files.items()},
            "stdin": base64.b64encode(job.stdin).decode(),
            "argv": job.command([self.config.docker_python]),
        }
        out, err, killed_for = bytearray(), bytearray(), None
        try:
            raw.settimeout(max(0.01, deadline - time.monotonic()))
            raw.sendall(json.dumps(header).encode() + b"\n")
            raw.shutdown(socket.SHUT_WR)
            killed_for = _demux(raw, deadline, lim.output_bytes, out, err)
        except TimeoutError:
            killed_for = "timeout"
        except OSError:
            pass  # the container closed the connection (it exited); its status says how
        finally:
            _close(raw, sock)  # first: the engine blocks on an undrained attach stream, a kill too
            if killed_for is not None:
                _kill(api, container)
        duration = time.monotonic() - started
        status, oom = self._status(container)
        if killed_for is None and oom:
            killed_for = "memory"
        stderr = err.decode(errors="replace")
        code = -(status - 128) if 128 < status < 128 + 65 else status  # BOOT: 128 + N for signal N
        verdict, detail = classify(code, stderr, killed_for=killed_for, wall_s=lim.wall_s, cpu_s=lim.cpu_s)
        return Outcome(
            verdict=verdict,
            stdout=out.decode(errors="replace"),
            stderr=stderr,
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            duration_s=duration,
            backend=self.name,
            detail=detail,
        )

    def _status(self, container: str) -> tuple[int, bool]:
        try:
            status = int(self.client.api.wait(container, timeout=30).get("StatusCode", -1))
            state = self.client.api.inspect_container(container)["State"]
        except Exception as exc:
            raise SandboxError(f"docker sandbox lost its container: {exc}") from exc
        return status, bool(state.get("OOMKilled"))


def _close(raw: socket.socket, sock: Any) -> None:
    try:
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    raw.close()
    sock.close()


def _kill(api: Any, container: str) -> None:
    try:
        api.kill(container)
    except Exception:
        pass  # exited meanwhile


def _demux(raw: socket.socket, deadline: float, cap: int, out: bytearray, err: bytearray) -> Verdict | None:
    """Read the attach stream (8-byte frame headers: stream, size) until EOF; returns why to kill, if so."""
    buf = bytearray()
    room = cap
    while True:
        raw.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = raw.recv(65536)
        if not chunk:
            return None
        buf += chunk
        while len(buf) >= 8:
            stream, size = buf[0], struct.unpack(">I", buf[4:8])[0]
            if len(buf) < 8 + size:
                break
            data = bytes(buf[8 : 8 + size])
            del buf[: 8 + size]
            keep = min(room, len(data))
            (err if stream == 2 else out).extend(data[:keep])
            room -= keep
            if keep < len(data):
                return "output_capped"
