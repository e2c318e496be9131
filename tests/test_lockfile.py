"""requirements.lock: exact pins that satisfy pyproject.toml, its sha256 in every manifest, drift warned about."""
from __future__ import annotations

import json
from importlib import metadata

import pytest

from harness import cli, lockfile
from tests._harness_fakes import registered_fakes


def test_lock_pins_every_project_requirement_exactly():
    lines = [ln for ln in lockfile.LOCK.read_text().splitlines() if ln and not ln.startswith("#")]
    assert all("==" in ln for ln in lines)
    assert lockfile.unmet(lines) == []  # satisfies pyproject.toml's ranges (dependencies and dev extra)
    locked = lockfile.read_lock()
    for pkg in ("torch", "transformers", "numpy", "scipy", "datasets", "torchattacks", "rxnfp", "pip"):
        assert lockfile.norm(pkg) in locked, pkg
    assert "attnlip" not in locked  # the project itself is installed editable, not pinned


def test_read_lock_rejects_anything_but_exact_pins(tmp_path):
    bad = tmp_path / "req.lock"
    bad.write_text("# comment\nnumpy==2.0\nscipy>=1.11\n")
    with pytest.raises(ValueError, match=r"req.lock:3: expected 'name==version', got 'scipy>=1.11'"):
        lockfile.read_lock(bad)


def test_drift_names_the_package_and_both_versions(tmp_path):
    lock = tmp_path / "requirements.lock"
    have = metadata.version("numpy")
    lock.write_text(f"numpy=={have}\ntorch==0.0.1\n")
    assert lockfile.drift(lock) == [("torch", "0.0.1", metadata.version("torch"))]
    msg = lockfile.drift_warning(lock)
    assert f"torch {metadata.version('torch')} (lock 0.0.1)" in msg and "numpy 2" not in msg
    lock.write_text(f"numpy=={have}\n")
    assert lockfile.drift_warning(lock) == ""
    assert lockfile.drift_warning(tmp_path / "absent.lock") == ""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    fakes = registered_fakes(tmp_path, monkeypatch, "fake_lock")
    mod, _ = next(fakes)
    yield mod
    next(fakes, None)


def test_run_records_the_lock_and_warns_about_drift(fake, tmp_path, monkeypatch, capsys):
    lock = tmp_path / "requirements.lock"
    lock.write_text(f"torch==0.0.1\nnumpy=={metadata.version('numpy')}\n")
    monkeypatch.setattr(lockfile, "LOCK", lock)
    results = tmp_path / "results"
    rc = cli.main(["_fake_squares", "--set", "n=1", "--results-dir", str(results), "--no-progress", "--no-figures"],
                  out=lambda *a: None)
    assert rc == 0
    err = capsys.readouterr().err
    assert "installed versions differ from requirements.lock: torch" in err and "(lock 0.0.1)" in err
    man = json.loads((results / "custom" / "full__n=1" / "_fake_squares" / "manifest.json").read_text())
    assert man["lock"]["sha256"] == lockfile.lock_sha256(lock)
    assert man["lock"]["drift"] == {"torch": {"lock": "0.0.1", "installed": metadata.version("torch")}}
