"""harness.store: canonical JSON, atomic writes, checksummed cell files, claims, safe artifacts."""
import json
import math
import os
import stat
import types

import pytest
import torch

from harness.store import artifacts, atomic, cells, claims


def test_canonical_json_order_and_scalars():
    import numpy as np

    a = atomic.canonical_json({"b": 1, "a": [1.5, float("nan")], "t": torch.tensor(2.5), "n": np.float64(3)})
    b = atomic.canonical_json({"n": 3.0, "t": 2.5, "a": [1.5, float("nan")], "b": 1})
    assert a == b


def test_cell_roundtrip_and_corruption(tmp_path):
    store = cells.CellCache(tmp_path)
    rec = {"experiment": "e", "key": "k" * 64, "cell": {"n": 1}, "rows": [{"v": 0.1, "w": math.inf}], "meta": {}}
    p = store.save(rec)
    got = store.load("e", "k" * 64)
    assert got["rows"][0]["v"] == 0.1 and got["rows"][0]["w"] == math.inf
    with pytest.raises(cells.CorruptCell, match="expected"):
        cells.load_cell(p, key="z" * 64)
    p.write_text(p.read_text()[:-5])
    with pytest.raises(cells.CorruptCell, match="truncated"):
        store.load("e", "k" * 64)
    with pytest.raises(FileNotFoundError):
        store.load("e", "x")
    assert not [f for f in tmp_path.rglob("*") if atomic.TMP_MARK in f.name]


def test_files_get_normal_permissions(tmp_path):
    """mkstemp gives 0600; a cache shared by a group needs the umask's normal mode."""
    old = os.umask(0o022)
    try:
        p = atomic.atomic_write_text(tmp_path / "x.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644


def test_atomic_write_failure_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "a.txt"
    target.write_text("old")

    def boom(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        atomic.atomic_write_text(target, "new")
    assert target.read_text() == "old" and [f.name for f in tmp_path.iterdir()] == ["a.txt"]


def test_artifacts_roundtrip_rebuild_and_code_key(tmp_path):
    cfg = {"model": "vit", "epochs": 2}
    p = artifacts.artifact_path("vit", cfg, tmp_path)
    assert p.parent == tmp_path / "vit" and p.suffix == ".pt"
    assert artifacts.artifact_path("vit", dict(reversed(list(cfg.items()))), tmp_path) == p
    assert artifacts.load_artifact("vit", cfg, tmp_path) is None
    sd = {"w": torch.arange(6.0).reshape(2, 3)}
    artifacts.save_artifact("vit", cfg, sd, tmp_path, meta={"acc": 0.9})
    obj, meta = artifacts.load_artifact("vit", cfg, tmp_path, with_meta=True)
    assert torch.equal(obj["w"], sd["w"]) and meta == {"acc": 0.9}
    calls = []
    got = artifacts.cached_artifact("vit", cfg, lambda: calls.append(1) or sd, tmp_path)
    assert not calls and torch.equal(got["w"], sd["w"])
    p.write_bytes(p.read_bytes()[:100])  # truncated -> warned, removed, rebuilt
    with pytest.warns(UserWarning, match="unusable"):
        assert artifacts.load_artifact("vit", cfg, tmp_path) is None
    got = artifacts.cached_artifact("vit", cfg, lambda: calls.append(1) or sd, tmp_path)
    assert calls == [1] and artifacts.load_artifact("vit", cfg, tmp_path) is not None
    # the code that builds an artifact is part of its key: no hand-bumped versions
    from harness.kernels import softmax

    assert artifacts.artifact_path("vit", cfg, tmp_path, code=[softmax]) != p

    class Ctx:
        artifacts = tmp_path / "ctxart"

    assert artifacts.artifact_path("vit", cfg, Ctx()).parent == tmp_path / "ctxart" / "vit"
    with pytest.raises(ValueError):
        artifacts.artifact_path("../x", cfg, tmp_path)


def test_objects_that_need_code_cannot_be_stored(tmp_path):
    with pytest.raises(TypeError, match="plain data"):
        artifacts.save_artifact("bad", {"a": 1}, types.SimpleNamespace(x=1), tmp_path)


class _Planted:
    """A pickle payload that would run code when unpickled (the attack a planted artifact would be)."""

    def __reduce__(self):
        return (os.system, (f"touch {os.environ['ATTNLIP_PWNED']}",))


def test_planted_artifact_is_refused_rebuilt_never_executed(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("ATTNLIP_PWNED", str(marker))
    cfg = {"model": "vit"}
    sd = {"w": torch.ones(2)}
    p = artifacts.save_artifact("vit", cfg, sd, tmp_path)
    good = torch.load(p, weights_only=True)
    # the attacker keeps a valid-looking blob and a matching checksum sidecar
    import io

    buf = io.BytesIO()
    torch.save(dict(good, obj=_Planted()), buf)
    p.write_bytes(buf.getvalue())
    side = p.with_suffix(".json")
    import json

    meta = json.loads(side.read_text())
    meta["sha256"] = atomic.sha256(buf.getvalue())
    side.write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match="safe loader"):
        assert artifacts.load_artifact("vit", cfg, tmp_path) is None
    assert not marker.exists() and not p.exists()
    got = artifacts.cached_artifact("vit", cfg, lambda: sd, tmp_path)  # rebuilt
    assert torch.equal(got["w"], sd["w"]) and not marker.exists()


def test_claims_exclusive_and_stale_takeover(tmp_path):
    c = claims.try_claim(tmp_path, "e", "k")
    assert c is not None and claims.claimed_elsewhere(tmp_path, "e", "k")
    assert claims.try_claim(tmp_path, "e", "k") is None  # held by a live process (this one)
    c.release()
    assert not claims.claimed_elsewhere(tmp_path, "e", "k")
    # a claim left by a dead process on this host is stale and taken over
    import json
    import socket
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    p = claims.claim_path(tmp_path, "e", "k2")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid}))
    assert not claims.claimed_elsewhere(tmp_path, "e", "k2")
    c2 = claims.try_claim(tmp_path, "e", "k2")
    assert c2 is not None
    c2.release()


def test_claims_are_written_whole_and_unreadable_ones_are_stale_at_once(tmp_path):
    """An empty or garbled claim (a full disk under an older writer, a crash) never stalls a run: it is taken over
    at once. A claim is created whole (temp file + link): no reader sees it empty."""
    p = claims.claim_path(tmp_path, "e", "k")
    p.parent.mkdir(parents=True)
    for debris in (b"", b"{\"host\": ", b"[1, 2]"):
        p.write_bytes(debris)
        assert claims.is_stale(p)
        c = claims.try_claim(tmp_path, "e", "k")
        assert c is not None and c.held and claims.holder(p)["pid"] == os.getpid()
        c.release()
        assert not p.exists()
    assert not [f for f in p.parent.iterdir()]  # no temp file left beside the claims


def test_a_full_cache_disk_gives_a_pseudo_claim_and_one_line(tmp_path, monkeypatch):
    import errno

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(claims, "_create", full)
    c = claims.try_claim(tmp_path, "e", "k")
    assert c is not None and not c.held  # the cell is computed without coordination
    other = claims.claim_path(tmp_path, "e", "k")
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text(json.dumps({"host": "elsewhere", "pid": 1, "time": 0}))
    c.release()
    assert other.exists()  # a pseudo-claim never removes a claim it does not hold
    line = atomic.os_error_line(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "cache" / "cells")
    assert line.startswith("cache disk full: ") and " MB free at " in line and str(tmp_path) in line
    assert atomic.os_error_line(PermissionError(13, "Permission denied"), tmp_path) == \
        "PermissionError: [Errno 13] Permission denied"
