"""The Node.js producer in examples/node-producer/, against a real broker and real workers.

The example uses the official NATS JavaScript client and Ajv over the schemas `gymbus schema` prints,
and nothing else of gymbus; its own tests (node:test) check what a producer in any language relies
on. Skipped when Node.js or the example's packages are absent (`npm ci` in the example's folder;
.ci/run does it).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MATH_TASKS, ROOT
from runtime.testing import Harness

EXAMPLE = ROOT / "examples" / "node-producer"

REQUIRED = os.environ.get("GYMBUS_REQUIRE_NODE") == "1"
"""Set by .ci/run's Node step, which installed the packages: a skip there would hide a failure."""

pytestmark = [
    pytest.mark.skipif(shutil.which("node") is None and not REQUIRED, reason="Node.js is not installed"),
    pytest.mark.skipif(
        not (EXAMPLE / "node_modules" / "@nats-io" / "jetstream").is_dir() and not REQUIRED,
        reason="the example's packages are not installed: run `npm ci` in examples/node-producer",
    ),
]


def write_schemas(folder: Path) -> None:
    """What a producer does first: save `gymbus schema` output, through the real command line."""
    folder.mkdir()
    cli = [sys.executable, "-m", "runtime", "schema"]
    for name, args in {"all.json": ["all"], "start-math.json": ["start", "--env", "math"]}.items():
        out = subprocess.run([*cli, *args], cwd=ROOT, capture_output=True, check=True, env=_no_broker())
        (folder / name).write_bytes(out.stdout)


def _no_broker() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GYMBUS_NATS_URL"}


async def test_node_producer(harness: Harness, tmp_path: Path) -> None:
    write_schemas(tmp_path / "schemas")
    await harness.simulate(MATH_TASKS, accuracy=0.75)
    await harness.worker("simple_agent")
    await harness.worker("math")
    env = {
        **_no_broker(),
        "NATS_URL": harness.broker.url,
        "GYMBUS_SCHEMAS": str(tmp_path / "schemas"),
        "GYMBUS_TASKS": str(MATH_TASKS),
    }
    proc = await asyncio.create_subprocess_exec(
        "node", "--test", "--test-reporter=spec", "test/",
        cwd=EXAMPLE, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=240)
    text = out.decode()
    print(text)
    assert proc.returncode == 0, text
    assert "ℹ fail 0" in text and "ℹ pass 4" in text
