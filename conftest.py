"""Fixtures shared by tests/ and functions/*/tests: a fresh broker per test, and the example tasks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runtime.testing import Harness, task_rows

ROOT = Path(__file__).parent
MATH_TASKS = ROOT / "functions" / "math" / "data" / "example.jsonl"


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    """A fresh nats-server (temp store), connected, with the topology created."""
    async with Harness(tmp_path / "broker") as h:
        yield h


@pytest.fixture
def math_rows() -> list[dict]:
    return task_rows(MATH_TASKS)
