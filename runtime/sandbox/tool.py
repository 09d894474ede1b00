"""``python``: a code-interpreter tool any environment can offer (``tools=[python]``).

Each call runs the model's code in a fresh sandbox (no state carries over between calls) and
answers with what it printed, or with the verdict and the end of its traceback when it failed,
cut to a size a model context can take. The candidate's failures are tool output the model reads
on its next turn; a sandbox that cannot run (``SandboxError``) fails the rollout with
``sandbox_error`` instead, retried per policy: an outage is never shown to the model as its mistake.
"""

from __future__ import annotations

from runtime.sandbox import default

MAX_CHARS = 4000


async def python(code: str) -> str:
    """Run Python 3 code in a fresh process (nothing persists between calls) and return what it prints."""
    outcome = await default().run(code)
    if outcome.ok:
        return _cut(outcome.stdout) if outcome.stdout.strip() else "(no output; print() what you want to see)"
    shown = outcome.stdout + ("\n" if outcome.stdout and not outcome.stdout.endswith("\n") else "")
    return _cut(f"{shown}{outcome.verdict}: {outcome.detail}\n{outcome.stderr.strip()[-1500:]}".strip())


def _cut(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    half = MAX_CHARS // 2
    return f"{text[:half]}\n... ({len(text) - MAX_CHARS} characters cut) ...\n{text[-half:]}"
