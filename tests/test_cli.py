"""Every command explains itself, and bad invocations fail with a clear message."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from runtime.cli import app

runner = CliRunner()


def test_top_level_help_lists_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("collect", "worker", "simulate"):
        assert command in result.output
    assert "configs/quickstart.yaml" in result.output


@pytest.mark.parametrize(
    "command,phrase",
    [
        ("collect", "--run-id"),
        ("worker", "gym.agent.<name>"),
        ("simulate", "not a model"),
    ],
)
def test_command_help(command: str, phrase: str) -> None:
    result = runner.invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert phrase in " ".join(result.output.split())


def test_worker_needs_a_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYMBUS_NATS_URL", raising=False)
    result = runner.invoke(app, ["worker", "math"])
    assert result.exit_code == 2
    assert "no broker" in result.output


def test_worker_unknown_function() -> None:
    result = runner.invoke(app, ["worker", "nosuchfn", "--nats", "nats://127.0.0.1:1"])
    assert result.exit_code == 2
    assert "no module 'functions.nosuchfn'" in result.output


def test_worker_wrong_role() -> None:
    result = runner.invoke(app, ["worker", "math", "--role", "agent", "--nats", "nats://127.0.0.1:1"])
    assert result.exit_code == 2
    assert "--role 'agent' is not served by 'math'" in " ".join(result.output.split())
