"""`gymbus check`, `gymbus new env`, `gymbus new agent`: the folders written pass their own tests as written,
and the check fails a verifier that rewards everything (or nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runtime.checking import check
from runtime.cli import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_check_command_prints_a_table_per_task_and_passes() -> None:
    result = runner.invoke(app, ["check", "mcqa"])
    assert result.exit_code == 0, result.output
    assert "gymbus check mcqa" in result.output and "check mcqa: PASS" in result.output
    assert "reward @1" in result.output and "reward @0" in result.output


def test_check_of_an_unknown_environment_is_one_line() -> None:
    result = runner.invoke(app, ["check", "no_such_env"])
    assert result.exit_code == 2
    assert "ENV 'no_such_env'" in result.output


@pytest.mark.parametrize("broken", ["always_right", "always_wrong"])
async def test_check_fails_a_verifier_that_cannot_tell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """A verifier that rewards everything fails at accuracy 0; one that rewards nothing fails at accuracy 1."""
    pkg = tmp_path / "pkgs"
    runner.invoke(app, ["new", "env", f"probe_{broken}", "--root", str(pkg)], catch_exceptions=False)
    env_py = pkg / f"probe_{broken}" / "env.py"
    verdict = "True" if broken == "always_right" else "False"
    env_py.write_text(env_py.read_text().replace("return Verdict(right,", f"return Verdict({verdict},"))
    monkeypatch.syspath_prepend(str(pkg))
    report = await check(f"probe_{broken}.env:ENVIRONMENT")
    assert not report.ok
    bad = "accuracy 0" if broken == "always_right" else "accuracy 1"
    assert all(any(p.startswith(bad) for p in t.problems) for t in report.tasks)


def test_new_env_and_new_agent_pass_their_generated_tests(tmp_path: Path) -> None:
    pkg = tmp_path / "pkgs"
    for kind, name in (("env", "quiz"), ("agent", "looper")):
        result = runner.invoke(app, ["new", kind, name, "--root", str(pkg)])
        assert result.exit_code == 0, result.output
    assert len((pkg / "quiz" / "env.py").read_text().splitlines()) <= 25
    again = runner.invoke(app, ["new", "env", "quiz", "--root", str(pkg)])
    assert again.exit_code == 2 and "already exists" in again.output
    bad = runner.invoke(app, ["new", "env", "Bad-Name", "--root", str(pkg)])
    assert bad.exit_code == 2 and "NAME 'Bad-Name'" in bad.output
    tests = [str(pkg / "quiz" / "tests"), str(pkg / "looper" / "tests")]
    env = {"PYTHONPATH": f"{pkg}:{ROOT}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout
