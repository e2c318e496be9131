"""harness.network: without a network, one short probe turns downloads off for the command (no minute of retries);
the environment's own setting always wins; with a network nothing changes."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from harness import network
from harness.store.codehash import REPO_ROOT


@pytest.fixture
def clean_env(monkeypatch):
    for v in network.DECIDED + (network.CHECKED, "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                                 "HF_ENDPOINT"):
        monkeypatch.setenv(v, "")  # recorded, so what the probe sets is undone after the test
        monkeypatch.delenv(v)
    monkeypatch.setattr(network, "_DONE", {})
    return monkeypatch


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_endpoint_turns_downloads_off_quickly(clean_env):
    clean_env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    t0 = time.perf_counter()
    note = network.offline_if_unreachable()
    assert time.perf_counter() - t0 < 2.0
    assert note and "no network" in note and "ATTNLIP_OFFLINE=1" in note
    assert all(os.environ[v] == "1" for v in network.OFFLINE_VARS)
    assert network.offline_if_unreachable() is None  # once per process


def test_notes_say_the_probe_decided_when_the_user_set_nothing(clean_env, tmp_path):
    """After the probe turned downloads off, the notes say no network was reached, never a variable the user did
    not set; a variable the user did set is named as before."""
    from harness.data import hub as data_hub, resolve
    from harness.models import hub as models_hub

    clean_env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    clean_env.setenv("NLTK_DATA", str(tmp_path / "nltk"))
    clean_env.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    clean_env.delenv("ATTNLIP_DATA", raising=False)
    import nltk

    clean_env.setattr(nltk.data, "path", [])
    assert network.offline_if_unreachable()
    why = data_hub.offline_reason()
    assert why.startswith("no network reached (127.0.0.1:") and why.endswith("; checked at start)"), why
    for text in (str(resolve.missing_error("alice")), models_hub.remote("some/model").reason,
                 resolve.fetch("sst2")[1]):
        assert "no network reached" in text and "OFFLINE=1" not in text, text
    for v in network.DECIDED + (network.CHECKED,):
        clean_env.delenv(v, raising=False)
    clean_env.setenv("HF_HUB_OFFLINE", "1")
    assert data_hub.offline_reason() == "HF_HUB_OFFLINE=1"
    assert "HF_HUB_OFFLINE=1" in models_hub.remote("some/model").reason


def test_a_silent_endpoint_is_reported_as_such(clean_env):
    def silent(addr, timeout):
        time.sleep(min(timeout, 0.2))
        raise socket.timeout("timed out")

    clean_env.setattr(network.socket, "create_connection", silent)
    assert network.probe(timeout=0.2) == "no answer from huggingface.co:443 within 0.2 s"


def test_a_reachable_endpoint_changes_nothing(clean_env):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    threading.Thread(target=lambda: srv.accept(), daemon=True).start()
    clean_env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{srv.getsockname()[1]}")
    assert network.offline_if_unreachable() is None
    assert not any(os.environ.get(v) for v in network.OFFLINE_VARS)
    srv.close()


@pytest.mark.parametrize("var, value", [("ATTNLIP_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"), ("ATTNLIP_OFFLINE", "0")])
def test_the_environment_decides_without_a_probe(clean_env, var, value):
    clean_env.setenv(var, value)
    clean_env.setattr(network, "probe", lambda timeout=0: pytest.fail("probed although the environment decides"))
    assert network.offline_if_unreachable() is None


def test_the_proxy_is_what_is_probed(clean_env):
    clean_env.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert network.endpoint() == ("proxy.example", 3128)


def test_run_all_without_network_spends_no_time_on_retries(tmp_path):
    """`run_all.py --dry-run --quick` with nothing set and an unreachable hub: one note, downloads off, done in
    seconds (no retry of any download), the missing items named by the dry run."""
    env = {k: v for k, v in os.environ.items() if k not in network.DECIDED + ("ATTNLIP_DATA", "NLTK_DATA", "HF_HOME")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}", HOME=str(tmp_path), HF_HOME=str(tmp_path / "hf"),
               NLTK_DATA=str(tmp_path / "nltk"))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "run_all.py", "--dry-run", "--quick", "jasmin_g1_ratio", "--no-progress",
                        "--results-dir", str(tmp_path / "res")], cwd=REPO_ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    took = time.perf_counter() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert out.count("note: no network") == 1 and "Traceback" not in out
    assert "would skip: dataset 'alice' is not available" in out and "attnlip data fetch alice" in out
    assert "no network reached" in out and "ATTNLIP_OFFLINE=1)" not in out  # the probe decided, not the user
    assert took < 60, took  # imports only; 47-70 s of retries before the probe


def test_outside_the_venv_one_line_not_a_traceback(tmp_path):
    """A Python without the project's packages (system python3 instead of the venv): one line naming the missing
    package and how to run inside the venv, exit 2, for run_all.py and attnlip."""
    import venv

    venv.EnvBuilder(with_pip=False).create(tmp_path / "bare")
    py = str(tmp_path / "bare" / "bin" / "python")
    for args, prog in ((["run_all.py", "--list"], "run_all.py"), (["-m", "harness.entry", "data", "list"], "attnlip")):
        r = subprocess.run([py, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                           env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)})
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: torch is not installed in this Python")
        assert "source .venv/bin/activate" in lines[0] and "make install" in lines[0]


def test_attnlip_data_alone_lists_its_commands(capsys):
    from harness.data import cli as data_cli

    assert data_cli.main([]) == 2
    out = capsys.readouterr().out
    assert "{list,fetch}" in out and "the following arguments are required" not in out
