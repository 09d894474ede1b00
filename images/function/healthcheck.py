"""Container health check for gymbus images: exit 0 iff an HTTP GET answers 200.

    gymbus-healthcheck [URL]      default: http://127.0.0.1:$GYMBUS_HTTP_PORT/healthz (the worker's)

The slim image has neither curl nor wget; the standard library is enough. An answer of 503 (not
connected, consumers not bound), a refused connection or a timeout all make it exit 1.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else f"http://127.0.0.1:{os.environ.get('GYMBUS_HTTP_PORT', '8080')}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            status = response.status
    except OSError as exc:  # URLError, HTTPError (503), refused, timed out
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
