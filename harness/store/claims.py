"""Per-cell claims: two runners (or workers) on one cache split the work instead of both computing every cell.

A claim is `<cache>/claims/<experiment>/<key>.claim`, created with O_EXCL and holding host, pid and time; its
holder refreshes its mtime (heartbeat) while it computes. A claim is stale, and taken over, when its process
is gone (same host) or its heartbeat is older than `STALE_S` (another host).
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

from .atomic import pid_alive

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
    if info and info.get("host") == socket.gethostname():
        return not pid_alive(int(info.get("pid", -1)))
    return age > STALE_S


class Claim:
    """A held claim; `release()` (or the context manager) removes it. Heartbeats in a daemon thread."""

    def __init__(self, path: Path):
        self.path = path
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._beat, daemon=True)
        self._t.start()

    def _beat(self):
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.path.unlink()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def try_claim(cache_dir, experiment: str, key: str) -> Optional[Claim]:
    """Claim a cell; None when a live holder has it. A stale claim is taken over. An unwritable cache gives a
    pseudo-claim (nothing to coordinate through; the cell is computed)."""
    path = claim_path(cache_dir, experiment, key)
    body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}).encode()
    for _ in range(3):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if is_stale(path):
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            return None
        except OSError:  # read-only cache
            return Claim(path)
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
        return Claim(path)
    return None


def claimed_elsewhere(cache_dir, experiment: str, key: str) -> bool:
    path = claim_path(cache_dir, experiment, key)
    return path.exists() and not is_stale(path)
