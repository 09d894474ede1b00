"""What this branch's checks expect from work merged separately (issue 3).

compose.yaml, the images and the Kubernetes manifests are written against these contracts:

- issue 3: `gymbus profiler --nats URL` (GYMBUS_NATS_URL), the results-stream profiling consumer;

Every check that depends on one of them is marked with its marker below, ``strict``: once the issue is
merged the check passes, pytest reports it as XPASS(strict) and fails, and the mark is deleted here.
"""

from __future__ import annotations

import pytest

ISSUE_3 = pytest.mark.xfail(strict=True, reason="awaits issue 3: `gymbus profiler`; delete this mark when merged")

SERVICES = {"profiler": ISSUE_3}
"""Services whose command does not exist yet (the process-level stack leaves these out)."""
FILES: dict[str, pytest.MarkDecorator] = {}
"""Files named by compose.yaml or the images that do not exist yet."""
