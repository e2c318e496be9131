"""Cache primitives: canonical JSON, atomic writes, checksummed cell files, artifacts."""
import math

import pytest
import torch

from harness import cache


def test_canonical_json_order_and_scalars():
    import numpy as np

    a = cache.canonical_json({"b": 1, "a": [1.5, float("nan")], "t": torch.tensor(2.5), "n": np.float64(3)})
    b = cache.canonical_json({"n": 3.0, "t": 2.5, "a": [1.5, float("nan")], "b": 1})
    assert a == b


def test_cell_roundtrip_and_corruption(tmp_path):
    store = cache.CellCache(tmp_path)
    rec = {"experiment": "e", "key": "k" * 64, "cell": {"n": 1}, "rows": [{"v": 0.1, "w": math.inf}], "meta": {}}
    p = store.save(rec)
    got = store.load("e", "k" * 64)
    assert got["rows"][0]["v"] == 0.1 and got["rows"][0]["w"] == math.inf
    with pytest.raises(cache.CorruptCell, match="expected"):
        cache.load_cell(p, key="z" * 64)
    p.write_text(p.read_text()[:-5])
    with pytest.raises(cache.CorruptCell, match="truncated"):
        store.load("e", "k" * 64)
    with pytest.raises(FileNotFoundError):
        store.load("e", "x")
    assert not [f for f in tmp_path.rglob("*") if cache.TMP_MARK in f.name]


def test_atomic_write_failure_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "a.txt"
    target.write_text("old")

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(cache.os, "replace", boom)
    with pytest.raises(OSError):
        cache.atomic_write_text(target, "new")
    assert target.read_text() == "old" and [f.name for f in tmp_path.iterdir()] == ["a.txt"]


def test_artifacts(tmp_path):
    cfg = {"model": "vit", "epochs": 2, "version": 1}
    p = cache.artifact_path("vit", cfg, tmp_path)
    assert p.parent == tmp_path / "vit" and p.suffix == ".pt"
    assert cache.artifact_path("vit", dict(reversed(list(cfg.items()))), tmp_path) == p
    assert cache.load_artifact("vit", cfg, tmp_path) is None
    sd = {"w": torch.arange(6.0).reshape(2, 3)}
    cache.save_artifact("vit", cfg, sd, tmp_path, meta={"acc": 0.9})
    obj, meta = cache.load_artifact("vit", cfg, tmp_path, with_meta=True)
    assert torch.equal(obj["w"], sd["w"]) and meta == {"acc": 0.9}
    calls = []
    got = cache.cached_artifact("vit", cfg, lambda: calls.append(1) or sd, tmp_path)
    assert not calls and torch.equal(got["w"], sd["w"])
    p.write_bytes(p.read_bytes()[:100])  # damaged -> warned, removed, rebuilt
    with pytest.warns(UserWarning, match="unusable"):
        assert cache.load_artifact("vit", cfg, tmp_path) is None
    got = cache.cached_artifact("vit", cfg, lambda: calls.append(1) or sd, tmp_path)
    assert calls == [1] and cache.load_artifact("vit", cfg, tmp_path) is not None

    class Ctx:
        artifacts = tmp_path / "ctxart"

    assert cache.artifact_path("vit", cfg, Ctx()).parent == tmp_path / "ctxart" / "vit"
    with pytest.raises(ValueError):
        cache.artifact_path("../x", cfg, tmp_path)
