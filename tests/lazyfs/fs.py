"""The file system: a passthrough to a backing directory whose file data waits in memory until fsync.

The model is LazyFS's (a FUSE file system with a page cache of its own that is written to the
backing file system only when the application asks for it):

- **data is lazy**: ``write`` and ``truncate`` change an in-memory image of the file (dirty 4 KiB
  pages, a logical size, and how much of the backing file is still valid); reads and ``stat`` see
  that image. ``fsync``/``fdatasync`` (or a write through a handle opened with ``O_SYNC``/``O_DSYNC``)
  writes the file's image to the backing file and fsyncs it. Nothing else ever does: there is no
  background writeback, so a crash loses every write since the file's last fsync (the worst case a
  real page cache allows).
- **metadata is eager**: create, mkdir, rename, unlink, link, chmod, utimens go to the backing
  directory at once, as in LazyFS (a journaling file system commits them in order; losing them is
  not modelled).

The power cut is the daemon's death (SIGKILL): its memory, i.e. every unsynced write, goes with
it, and the backing directory is what the disk holds afterwards. `tests.lazyfs.LazyMount` drives it.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mfusepy as fuse

PAGE = 4096
SYNC_FLAGS = os.O_SYNC | os.O_DSYNC


@dataclass
class Image:
    """A file's unsynced state: what a read sees on top of the backing file."""

    path: str
    """Where the file was when it got dirty (for reports)."""
    size: int
    """Logical size."""
    valid: int
    """Bytes of the backing file still part of the file (a truncate below them cuts them off)."""
    pages: dict[int, bytearray] = field(default_factory=dict)

    def backing(self, fd: int, offset: int, n: int) -> bytearray:
        """``n`` bytes at ``offset`` as the backing file gives them (zeros past what is still valid)."""
        out = bytearray(os.pread(fd, max(0, min(n, self.valid - offset)), offset)) if offset < self.valid else b""
        return bytearray(out) + bytes(n - len(out))

    def write(self, fd: int, offset: int, data: bytes) -> None:
        end = offset + len(data)
        for index in range(offset // PAGE, (end - 1) // PAGE + 1):
            page = self.pages.get(index)
            if page is None:
                page = self.pages[index] = self.backing(fd, index * PAGE, PAGE)
            lo, hi = max(offset, index * PAGE), min(end, (index + 1) * PAGE)
            page[lo - index * PAGE : hi - index * PAGE] = data[lo - offset : hi - offset]
        self.size = max(self.size, end)

    def read(self, fd: int, offset: int, n: int) -> bytes:
        end = min(offset + n, self.size)
        if end <= offset:
            return b""
        out = self.backing(fd, offset, end - offset)
        for index in range(offset // PAGE, (end - 1) // PAGE + 1):
            page = self.pages.get(index)
            if page is not None:
                lo, hi = max(offset, index * PAGE), min(end, (index + 1) * PAGE)
                out[lo - offset : hi - offset] = page[lo - index * PAGE : hi - index * PAGE]
        return bytes(out)

    def truncate(self, length: int) -> None:
        if length < self.size:
            for index in [i for i in self.pages if i * PAGE >= length]:
                del self.pages[index]
            tail = self.pages.get(length // PAGE)
            if tail is not None:
                tail[length % PAGE :] = bytes(PAGE - length % PAGE)
            self.valid = min(self.valid, length)
        self.size = length

    def flush(self, fd: int) -> None:
        """Write this image to the backing file and make it durable."""
        if os.fstat(fd).st_size > self.valid:
            os.ftruncate(fd, self.valid)
        for index, page in sorted(self.pages.items()):
            os.pwrite(fd, page, index * PAGE)
        os.ftruncate(fd, self.size)
        os.fsync(fd)


@dataclass
class Handle:
    fd: int
    ino: int
    sync: bool
    path: str


class LazyFS(fuse.Operations):
    """Every path is ``root`` + path; file data is held in `Image` s until fsync."""

    use_ns = True

    def __init__(self, root: str | Path) -> None:
        self.root = str(Path(root).resolve())
        self.images: dict[int, Image] = {}
        self.handles: dict[int, Handle] = {}
        self._mutex = threading.Lock()
        self.next_fh = 1
        self.counts = {"writes": 0, "fsyncs": 0}

    def _path(self, path: str) -> str:
        return self.root + path

    # ---- metadata: straight to the backing directory ---------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(self.handles[fh].fd) if fh in self.handles else os.lstat(self._path(path))
        attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_ino", "st_blocks")}
        attrs |= {k: getattr(st, f"{k}_ns") for k in ("st_atime", "st_mtime", "st_ctime")}
        with self._mutex:
            image = self.images.get(st.st_ino)
        attrs["st_size"] = image.size if image is not None else st.st_size
        return attrs

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._path(path))]

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._path(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._path(path))
        return 0

    def unlink(self, path: str) -> int:
        self._forget_if_last_link(self._path(path))
        os.unlink(self._path(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        if os.path.lexists(self._path(new)) and not os.path.isdir(self._path(new)):
            self._forget_if_last_link(self._path(new))
        os.rename(self._path(old), self._path(new))
        return 0

    def _forget_if_last_link(self, real: str) -> None:
        st = os.lstat(real)
        if st.st_nlink <= 1:
            with self._mutex:
                self.images.pop(st.st_ino, None)

    def link(self, target: str, source: str) -> int:
        os.link(self._path(source), self._path(target))
        return 0

    def symlink(self, target: str, source: str) -> int:
        os.symlink(source, self._path(target))
        return 0

    def readlink(self, path: str) -> str:
        return os.readlink(self._path(path))

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._path(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._path(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._path(path), ns=times)
        return 0

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._path(path), amode):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._path(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize")
        return {k: getattr(st, k) for k in keys} | {"f_namemax": st.f_namemax}

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0  # metadata is durable at once

    # ---- data: held until fsync ------------------------------------------------------------------

    def _open(self, real: str, flags: int, mode: int = 0o644) -> int:
        keep = os.O_CREAT | os.O_EXCL if flags & os.O_CREAT else 0
        fd = os.open(real, os.O_RDWR | (flags & keep), mode)  # read-modify-write needs both, never O_APPEND
        with self._mutex:
            fh, self.next_fh = self.next_fh, self.next_fh + 1
            self.handles[fh] = Handle(fd, os.fstat(fd).st_ino, bool(flags & SYNC_FLAGS), real)
        if flags & os.O_TRUNC:
            self.truncate("", 0, fh)
        return fh

    def open(self, path: str, flags: int) -> int:
        return self._open(self._path(path), flags)

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        return self._open(self._path(path), flags | os.O_CREAT, mode)

    def _image(self, h: Handle) -> Image:
        image = self.images.get(h.ino)
        if image is None:
            size = os.fstat(h.fd).st_size
            image = self.images[h.ino] = Image(h.path[len(self.root) :], size=size, valid=size)
        return image

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        h = self.handles[fh]
        with self._mutex:
            image = self.images.get(h.ino)
            if image is not None:
                return image.read(h.fd, offset, size)
        return os.pread(h.fd, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        h = self.handles[fh]
        with self._mutex:
            self._image(h).write(h.fd, offset, data)
            self.counts["writes"] += 1
            if h.sync:
                self._sync(h)
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is None:
            fh = self._open(self._path(path), os.O_RDWR)
            try:
                return self.truncate(path, length, fh)
            finally:
                self.release(path, fh)
        h = self.handles[fh]
        with self._mutex:
            self._image(h).truncate(length)
            if h.sync:
                self._sync(h)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            self._sync(self.handles[fh])
        return 0

    def _sync(self, h: Handle) -> None:
        image = self.images.pop(h.ino, None)
        self.counts["fsyncs"] += 1
        if image is not None:
            image.flush(h.fd)

    def flush(self, path: str, fh: int) -> int:
        return 0  # close() is not a sync

    def release(self, path: str, fh: int) -> int:
        with self._mutex:
            h = self.handles.pop(fh)
            if os.fstat(h.fd).st_nlink == 0 and not any(o.ino == h.ino for o in self.handles.values()):
                self.images.pop(h.ino, None)
        os.close(h.fd)
        return 0

    def checkpoint(self) -> int:
        """Write every file's image to the backing directory (a clean shutdown); returns how many."""
        flushed = 0
        with self._mutex:
            for folder, _, files in os.walk(self.root):
                for name in files:
                    real = os.path.join(folder, name)
                    image = self.images.pop(os.lstat(real).st_ino, None)
                    if image is not None:
                        fd = os.open(real, os.O_RDWR)
                        try:
                            image.flush(fd)
                        finally:
                            os.close(fd)
                        flushed += 1
        return flushed

    def report(self) -> dict[str, Any]:
        """What a power cut now would lose: dirty bytes (page-rounded) per file, and the op counts."""
        with self._mutex:
            dirty = {i.path: len(i.pages) * PAGE for i in self.images.values()}
            return {"unsynced": dirty, **self.counts}
