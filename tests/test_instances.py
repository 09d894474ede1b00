"""Servers an environment starts itself (runtime/instances.py): replaced when dead, under a new name;
a start that fails is reported with its log and not retried at once; a pinned call to a dead one is
``env_lost``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runtime import pins
from runtime.errors import EnvLost
from runtime.instances import Child, Pool, spawn


def _http_server(log_dir: Path, fail: bool = False):  # type: ignore[no-untyped-def]
    def start(name: str, port: int) -> Child:
        code = "raise SystemExit('no luck')" if fail else None
        cmd = (
            [sys.executable, "-c", code]
            if code
            else [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
        )
        return spawn(name, port, cmd, cwd=log_dir, env={}, log_dir=log_dir)

    return start


async def test_a_dead_instance_is_replaced_under_a_new_name(tmp_path: Path) -> None:
    pool = Pool("files", 2, _http_server(tmp_path))
    try:
        first = await pool.live()
        assert len({c.name for c in first}) == 2 and all(c.name.startswith("files_") for c in first)
        first[0].proc.kill()
        first[0].proc.wait()
        second = await pool.live()
        assert first[1] in second and first[0] not in second and len(second) == 2
        with pytest.raises(EnvLost, match=r"instance files_.* is gone"):
            await pins.post(first[0].url + "/", {}, who=f"instance {first[0].name}", method="GET")
        answer = await pins.post(second[0].url + "/", None, who="x", method="GET")
        assert answer.status == 200
    finally:
        pool.close()


async def test_a_start_that_fails_says_why_and_is_not_retried_at_once(tmp_path: Path) -> None:
    pool = Pool("broken", 1, _http_server(tmp_path, fail=True))
    with pytest.raises(RuntimeError, match=r"exited .* no luck"):
        await pool.live()
    logs = sorted(tmp_path.glob("broken_*.log"))
    with pytest.raises(RuntimeError, match="no luck"):
        await pool.live()
    assert sorted(tmp_path.glob("broken_*.log")) == logs  # nothing started the second time
