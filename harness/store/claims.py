"""Per-cell claims: two runners (or workers) on one cache split the work instead of both computing every cell.

A claim is `<cache>/claims/<experiment>/<key>.claim` holding host, pid and time. It is written whole to a
temporary file and then hard-linked to its name (which fails if the name exists), so a claim is never seen empty
or half-written; its holder refreshes its mtime (heartbeat) while it computes. A claim is stale, and taken over,
when its process is gone (same host), its heartbeat is older than `STALE_S` (another host), or it cannot be read
(a claim is only ever written whole, so an unreadable one is debris: a full disk, a crash of an older writer).
A cache that cannot hold a claim (read-only, full disk) gives a pseudo-claim: the cell is computed without
coordination, and releasing it removes nothing.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Optional

import errno
import tempfile

from .atomic import TMP_MARK, pid_alive

STALE_S = 300.0
HEARTBEAT_S = 20.0


def claim_path(cache_dir, experiment: str, key: str) -> Path:
    return Path(cache_dir) / "claims" / experiment / f"{key}.claim"


def holder(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def is_stale(path: Path) -> bool:
    """True when the claim's holder is gone (same host: its pid is dead; else: no heartbeat for STALE_S)."""
    info = holder(path)
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return True
    if not isinstance(info, dict):
        return True  # unreadable: claims are written whole, so this one is debris
    if info.get("host") == socket.gethostname():
        return not pid_alive(int(info.get("pid", -1)))
    return age > STALE_S


class Claim:
    """A held claim; `release()` (or the context manager) removes it. Heartbeats in a daemon thread."""

    def __init__(self, path: Path, held: bool = True):
        self.path, self.held = path, held  # held False: a pseudo-claim (the cache could not hold one)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._beat, daemon=True)
        if held:
            self._t.start()

    def _beat(self):
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self.held:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _create(path: Path, body: bytes) -> None:
    """Create the claim file whole, or FileExistsError when it exists (temp file + hard link; O_EXCL and one write
    where the file system has no hard links)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{TMP_MARK}{socket.gethostname()}.{os.getpid()}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
        try:
            os.link(tmp, path)
            return
        except FileExistsError:
            raise
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
        fd2 = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd2, "wb") as fh:
            fh.write(body)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def try_claim(cache_dir, experiment: str, key: str) -> Optional[Claim]:
    """Claim a cell; None when a live holder has it. A stale claim is taken over. A cache that cannot hold a claim
    (read-only, disk full) gives a pseudo-claim (nothing to coordinate through; the cell is computed)."""
    path = claim_path(cache_dir, experiment, key)
    body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}).encode()
    for _ in range(3):
        try:
            _create(path, body)
        except FileExistsError:
            if is_stale(path):
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            return None
        except OSError:  # read-only or full cache
            return Claim(path, held=False)
        return Claim(path)
    return None


def claimed_elsewhere(cache_dir, experiment: str, key: str) -> bool:
    path = claim_path(cache_dir, experiment, key)
    return path.exists() and not is_stale(path)


def remove_stale(cache_dir) -> int:
    """Remove the claims under `<cache>/claims` whose holder is gone (is_stale), e.g. the workers of an interrupted
    run; returns how many."""
    n = 0
    for path in sorted((Path(cache_dir) / "claims").glob("*/*.claim")):
        if is_stale(path):
            with contextlib.suppress(OSError):
                path.unlink()
                n += 1
    return n
