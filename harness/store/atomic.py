"""Canonical JSON, hashes and atomic file writes (a reader never sees a partial file)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterator, List, Optional, Union

TMP_MARK = ".tmp."
FILE_MODE = 0o644  # normal permissions, so a cache shared by a group works (mkstemp alone gives 0600)


def _jsonable(o: Any) -> Any:
    """Fallback for json.dumps: numpy/torch scalars and small arrays (via .tolist()), Paths, sets."""
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"not JSON-serializable: {type(o).__name__} {o!r}"[:200])


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, NaN/inf allowed (round-trips through json.loads)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_jsonable, allow_nan=True)


def sha256(text: Union[str, bytes]) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return FILE_MODE & ~umask


def atomic_write_bytes(path: Union[str, Path], data: bytes) -> Path:
    """Write `data` to `path` via a same-directory temp file + fsync + os.replace (never a partial file).

    An OSError (disk full, read-only folder) propagates with its real cause after the temp file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{TMP_MARK}{socket.gethostname()}.{os.getpid()}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: Union[str, Path], text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


@contextlib.contextmanager
def staged_files(outdir: Union[str, Path]) -> Iterator[Path]:
    """A temp folder inside `outdir` to write a set of files into (any writer: pandas, matplotlib, text). When the
    block ends normally every file there is fsynced and moved onto its namesake in `outdir` with os.replace, so
    each output is the old complete file or the new complete one, never a partial file; when it raises (a full
    disk), nothing in `outdir` changes. The temp folder is removed either way."""
    import shutil

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=outdir, prefix=f".staging{TMP_MARK}{socket.gethostname()}.{os.getpid()}."))
    try:
        yield stage
        made = sorted(f for f in stage.rglob("*") if f.is_file())
        for f in made:
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
            os.chmod(f, _mode())
        for f in made:
            dest = outdir / f.relative_to(stage)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def folder_problem(path: Union[str, Path]) -> Optional[str]:
    """Why `path` cannot be a folder to write into, or None: it (or a folder on its way) is a symbolic link loop, or
    it is a file. Output and cache folders are checked with it before anything runs (run_all.py's --results-dir and
    --cache-dir, attnlip analyze's and certify's --out)."""
    p = Path(path).expanduser()
    try:
        p.resolve()
        is_file = p.exists() and not p.is_dir()
    except (RuntimeError, OSError) as e:  # RuntimeError: pathlib's "Symlink loop" (Python < 3.13), else ELOOP
        return f"{path} is not a usable folder ({e})"
    return f"{path} is a file, not a folder" if is_file else None


def unwritable(path: Union[str, Path]) -> Optional[str]:
    """Why no file can be written into the folder `path`, or None: `path` (and its missing parents) is created and a
    probe file written and removed there; on failure the folders this check created are removed again. Output
    folders are checked with it before anything is computed or downloaded."""
    root = Path(path).expanduser()
    why = folder_problem(root)
    if why:
        return why
    root = root.resolve()
    created = [p for p in [root, *root.parents] if not p.exists()]
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".attnlip-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        for p in created:  # deepest first: only the empty folders made here
            try:
                p.rmdir()
            except OSError:
                break
        return f"{path} is not writable ({e.__class__.__name__}: {e.strerror or e})"
    return None


def os_error_line(e: OSError, path: Union[str, Path]) -> str:
    """One line for a failed write under `path`: "cache disk full: N MB free at PATH" for ENOSPC (and EDQUOT), else
    the error's class and message."""
    import errno
    import shutil

    if getattr(e, "errno", None) in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        where = Path(path)
        while not where.exists() and where != where.parent:
            where = where.parent
        try:
            free = f"{shutil.disk_usage(where).free / 2 ** 20:.0f} MB free"
        except OSError:
            free = "free space unknown"
        return f"cache disk full: {free} at {where}"
    return f"{e.__class__.__name__}: {e}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(root: Union[str, Path]) -> List[Path]:
    """Remove temp files left under `root` by killed writers on this host (their pid is gone)."""
    root = Path(root)
    removed: List[Path] = []
    if not root.exists():
        return removed
    host = socket.gethostname()
    for f in root.rglob(f".*{TMP_MARK}*"):
        tail = f.name.split(TMP_MARK, 1)[1]  # host.pid.random
        try:
            h, pid = tail.rsplit(".", 2)[0], int(tail.rsplit(".", 2)[1])
        except (IndexError, ValueError):
            continue
        if h == host and not pid_alive(pid):
            with contextlib.suppress(OSError):
                f.unlink()
                removed.append(f)
    return removed
