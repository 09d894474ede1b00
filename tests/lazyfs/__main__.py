"""Serve a lazy mount: ``python -m tests.lazyfs BACKING MOUNTPOINT --control SOCKET`` (foreground).

``SOCKET`` (a Unix socket outside the mount) answers ``report`` with what a power cut would lose now,
and ``checkpoint`` by writing everything to the backing directory (a clean shutdown).
Kill the process with SIGKILL to cut the power; `tests.lazyfs.LazyMount` does all of this.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socketserver
import threading
from pathlib import Path

from tests.lazyfs.fs import LazyFS


def forget_orphans(root: Path) -> int:
    """Files libfuse hid because they were unlinked while open: a crash frees them (as a journal's
    orphan list does), so they do not outlive it here either."""
    hidden = [p for p in root.rglob(".fuse_hidden*") if p.is_file()]
    for p in hidden:
        p.unlink()
    return len(hidden)


def serve_control(fs: LazyFS, path: str) -> None:
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            command = self.rfile.readline().strip()
            if command == b"report":
                self.wfile.write(json.dumps(fs.report()).encode() + b"\n")
            elif command == b"checkpoint":
                self.wfile.write(json.dumps({"flushed": fs.checkpoint()}).encode() + b"\n")

    if os.path.exists(path):
        os.unlink(path)
    server = socketserver.UnixStreamServer(path, Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main() -> None:
    import mfusepy

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--control", required=True, help="Unix socket answering `report`")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s lazyfs %(levelname)s %(message)s")
    args.backing.mkdir(parents=True, exist_ok=True)
    args.mountpoint.mkdir(parents=True, exist_ok=True)
    orphans = forget_orphans(args.backing)
    fs = LazyFS(args.backing)
    serve_control(fs, args.control)
    print(json.dumps({"backing": str(args.backing), "orphans_freed": orphans}), flush=True)
    mfusepy.FUSE(fs, str(args.mountpoint), foreground=True, nothreads=False, fsname="gymbus-lazyfs")


if __name__ == "__main__":
    main()
