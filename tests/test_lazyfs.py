"""The lazy mount itself: unsynced writes are lost on a cut, synced ones are kept, and a real
nats-server runs on it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lazyfs import LazyMount, unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"no lazy mount here: {unavailable()}")


@pytest.fixture
def lazy(tmp_path: Path) -> Iterator[LazyMount]:
    with LazyMount(tmp_path / "disk", tmp_path / "mnt") as m:
        yield m


def write(path: Path, data: bytes, *, sync: bool, mode: str = "wb") -> None:
    with open(path, mode) as fh:
        fh.write(data)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())


def test_a_cut_keeps_what_was_fsynced_and_loses_the_rest(lazy: LazyMount) -> None:
    mnt = lazy.mountpoint
    write(mnt / "synced", b"a" * 10_000, sync=True)
    write(mnt / "synced", b"b" * 5_000, sync=False, mode="ab")  # appended, never synced
    write(mnt / "never", b"c" * 100, sync=False)
    assert (mnt / "synced").read_bytes() == b"a" * 10_000 + b"b" * 5_000  # readers see the page cache
    assert (lazy.backing / "synced").stat().st_size == 10_000  # the disk has only the synced part
    assert lazy.report()["unsynced"] == {"/synced": 8192, "/never": 4096}
    lazy.cut()
    lazy.start()
    assert (mnt / "synced").read_bytes() == b"a" * 10_000
    assert (mnt / "never").read_bytes() == b""  # created (metadata is eager), its data lost


def test_overwrites_truncates_and_renames_follow_the_file(lazy: LazyMount) -> None:
    mnt = lazy.mountpoint
    write(mnt / "f", bytes(range(256)) * 64, sync=True)  # 16 KiB on disk
    with open(mnt / "f", "r+b") as fh:
        fh.seek(5000)
        fh.write(b"X" * 10)
        fh.truncate(9000)
        fh.seek(12_000)
        fh.write(b"Y")  # a hole from 9000 to 12000 reads as zeros, not as the old bytes
    data = (mnt / "f").read_bytes()
    assert len(data) == 12_001 and data[5000:5010] == b"X" * 10 and data[9000:12_000] == bytes(3000)
    os.rename(mnt / "f", mnt / "g")
    with open(mnt / "g", "rb+") as fh:
        os.fsync(fh.fileno())
    assert (lazy.backing / "g").read_bytes() == data
    write(mnt / "g", b"gone", sync=False)  # O_TRUNC, unsynced: the cut restores the synced image
    lazy.cut()
    lazy.start()
    assert (mnt / "g").read_bytes() == data


def test_o_sync_writes_are_durable_at_once(lazy: LazyMount) -> None:
    fd = os.open(lazy.mountpoint / "log", os.O_WRONLY | os.O_CREAT | os.O_SYNC, 0o644)
    os.write(fd, b"kept")
    os.close(fd)
    lazy.cut()
    lazy.start()
    assert (lazy.mountpoint / "log").read_bytes() == b"kept"


def test_a_clean_shutdown_keeps_everything(lazy: LazyMount) -> None:
    write(lazy.mountpoint / "log", b"line\n" * 1000, sync=False)
    os.rename(lazy.mountpoint / "log", lazy.mountpoint / "log.1")
    lazy.stop()
    assert (lazy.backing / "log.1").read_bytes() == b"line\n" * 1000
