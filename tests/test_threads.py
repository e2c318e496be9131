"""The thread policy (harness.config.init_threads): passive OpenMP waiting set before torch loads libgomp (checked
through libgomp's own report of its settings), the user's settings win, and the automatic count follows the cores
that are free (affinity minus the cores a live /proc/stat sample finds busy; the load average only without
/proc/stat) shared by the workers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import config

REPO = Path(__file__).resolve().parent.parent


def _libgomp_settings(code: str, **env) -> str:
    """stderr of a fresh interpreter running `code`, with libgomp printing its settings when it initialises."""
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "ATTNLIP_THREADS")}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(base, OMP_DISPLAY_ENV="VERBOSE", **env),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def test_passive_wait_reaches_libgomp_when_set_before_torch():
    out = _libgomp_settings("from harness import config; config.init_threads(); import torch; torch.ones(2).sum()")
    assert "GOMP_SPINCOUNT = '0'" in out and "OMP_WAIT_POLICY = 'PASSIVE'" in out, out


def test_passive_wait_cannot_be_set_after_torch_loaded():
    out = _libgomp_settings("import torch, os; from harness import config; config.init_threads(); "
                            "print('policy env:', os.environ.get('OMP_WAIT_POLICY'))")
    assert "GOMP_SPINCOUNT = '300000'" in out  # libgomp's default spinning, read when torch loaded it
    assert "policy env: None" in out  # not set where it could not work (child processes inherit torch's default)


def test_the_users_wait_policy_wins():
    out = _libgomp_settings("from harness import config; config.init_threads(); import torch", OMP_WAIT_POLICY="ACTIVE")
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in out


@pytest.fixture
def restore_threads(monkeypatch):
    before = torch.get_num_threads()
    for k in ("ATTNLIP_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    yield monkeypatch
    torch.set_num_threads(before)


def fake_cpu_sample(monkeypatch, busy):
    """/proc/stat as two readings 0.1 s apart in which CPU i was busy for the fraction busy[i] of the time."""
    state = {"t": 0}

    def reading():
        t = state["t"]
        state["t"] += 100
        return {i: (int(round(b * t)), t) for i, b in enumerate(busy)}

    monkeypatch.setattr(config, "_proc_stat", reading)


@pytest.mark.parametrize("busy, jobs, expect", [((0, 0, 0, 0), 1, 4), ((1, 0.3, 0, 0), 1, 3), ((1, 1, 0.6, 0), 1, 1),
                                                ((1, 1, 1, 1), 1, 1), ((0.2, 0, 0, 0), 2, 2), ((1, 0, 0, 0), 4, 1)])
def test_automatic_count_takes_the_free_cores(restore_threads, busy, jobs, expect):
    fake_cpu_sample(restore_threads, busy)
    restore_threads.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))  # not read while /proc/stat answers
    assert config.init_threads(jobs=jobs) == expect == torch.get_num_threads()


def test_the_count_follows_the_load_at_once(restore_threads):
    """Right after a 2-core job ended, the 1-minute load average still says 1.9 while the CPUs are idle: the live
    sample gives every core, and says where the count came from."""
    restore_threads.setattr(os, "getloadavg", lambda: (1.9, 1.2, 0.6))
    restore_threads.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    fake_cpu_sample(restore_threads, (0.02, 0.0))
    got = config.init_threads_choice()
    assert got.count == 2 and got.source == "cpu sample" and "0.02 of 2 cores busy" in got.detail
    fake_cpu_sample(restore_threads, (1.0, 0.0))  # a job holds one core now
    assert config.init_threads_choice().count == 1


def test_the_real_cpu_sample_reads_this_machine():
    busy = config.busy_cores(interval=0.05)
    if busy is None:
        pytest.skip("no /proc/stat here")
    assert 0.0 <= busy <= config.available_cores() + 1e-9


@pytest.mark.parametrize("load, expect", [(0.0, 4), (1.3, 3), (2.6, 1), (9.0, 1)])
def test_without_proc_stat_the_load_average_decides(restore_threads, load, expect):
    restore_threads.setattr(config, "_proc_stat", lambda: None)
    restore_threads.setattr(os, "getloadavg", lambda: (load, load, load))
    got = config.thread_choice()
    assert got == (expect, "load average", f"1-minute load average {load:.2f} on 4 cores")


def test_explicit_and_environment_counts_win(restore_threads):
    fake_cpu_sample(restore_threads, (0, 0, 0, 0))
    assert config.init_threads(threads=3) == 3
    assert config.thread_choice(threads=3) == (3, "--threads", "")
    restore_threads.setenv("ATTNLIP_THREADS", "2")
    assert config.init_threads() == 2 and config.thread_choice().source == "$ATTNLIP_THREADS"
    assert config.init_threads(threads=1) == 1  # --threads over the environment
    restore_threads.delenv("ATTNLIP_THREADS")
    torch.set_num_threads(3)
    restore_threads.setenv("OMP_NUM_THREADS", "3")  # torch read it at start-up: the count is left as it is
    assert config.init_threads() == 3


@pytest.mark.parametrize("bad", ["abc", "0", "-2"])
def test_bad_thread_counts_are_named(restore_threads, bad):
    restore_threads.setenv("ATTNLIP_THREADS", bad)
    with pytest.raises(ValueError, match=r"threads must be"):
        config.init_threads()


def _analyze_threads(monkeypatch, capsys, argv):
    """Run `attnlip analyze ARGV` up to its option checks, recording torch's thread count there (the check then
    stops it with a usage error, so no model loads). Returns (count during the analysis, stderr)."""
    from harness import entry
    from harness.analyze import validate

    seen = []

    def stop(a):
        seen.append(torch.get_num_threads())
        raise validate.UsageError("--test", "stopped here", "nothing")

    monkeypatch.setattr(validate, "check_options", stop)
    assert entry.main(["analyze", "--model", "minilm", "--text", "x", *argv]) == 2
    return (seen[0] if seen else None), capsys.readouterr().err


def test_analyze_threads_option_and_note(monkeypatch, capsys):
    for k in ("ATTNLIP_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(config, "available_cores", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    fake_cpu_sample(monkeypatch, (1.0, 0.4))  # one core taken
    before = torch.get_num_threads()
    count, err = _analyze_threads(monkeypatch, capsys, [])
    assert count == 1 and "note: 1 of 2 cores (1.40 of 2 cores busy in a 0.1 s sample); --threads 2 uses all of " \
        "them" in err
    count, err = _analyze_threads(monkeypatch, capsys, ["--threads", "2"])
    assert count == 2 and "note:" not in err  # the user's count: no note
    assert torch.get_num_threads() == before  # the caller's count is given back
    fake_cpu_sample(monkeypatch, (0.1, 0.0))
    count, err = _analyze_threads(monkeypatch, capsys, [])
    assert count == 2 and "note:" not in err


def test_analyze_threads_must_be_positive(monkeypatch, capsys):
    from harness import entry

    assert entry.main(["analyze", "--model", "minilm", "--text", "x", "--threads", "0"]) == 2
    err = capsys.readouterr().err
    assert "--threads: 0 is not a thread count. Fix: give a whole number >= 1" in err and "Traceback" not in err


def test_run_all_refuses_more_threads_than_cores(monkeypatch, capsys, tmp_path):
    from harness import cli

    monkeypatch.setattr(config, "available_cores", lambda: 2)
    base = ["--dry-run", "--results-dir", str(tmp_path), "jasmin_softmax"]
    assert cli.main(["--threads", "999"] + base, out=lambda *a: None) == 2
    assert "--threads 999 x 1 worker(s) on 2 available core(s)" in capsys.readouterr().err
    assert cli.main(["--threads", "2", "-j", "2"] + base, out=lambda *a: None) == 2  # 2 workers x 2 threads
    assert "pass --threads 1 or less" in capsys.readouterr().err
    assert cli.main(["--threads", "2"] + base, out=lambda *a: None) == 0
    assert cli.main(["--threads", "8", "--executor", "submitit"] + base, out=lambda *a: None) == 0  # other nodes


# ---- portable numerics: torch's CPU code paths pinned to AVX2 (config.portable_numerics) -------------------------
PIN = "from harness import config; print('set:', config.portable_numerics()); import torch; " \
      "print('capability:', torch.backends.cpu.get_cpu_capability())"


def _fresh(code: str, **env) -> str:
    base = {k: v for k, v in os.environ.items() if k not in (*config.PORTABLE_ISA, config.NATIVE_ISA_ENV)}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(base, **env), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(not config._has_avx2(), reason="pins only x86-64 CPUs with AVX2")
def test_portable_numerics_pins_torch_to_avx2_before_it_loads():
    out = _fresh(PIN)
    assert "capability: AVX2" in out, out
    assert "'MKL_ENABLE_INSTRUCTIONS': 'AVX2'" in out and "'ONEDNN_MAX_CPU_ISA': 'AVX2'" in out, out
    assert "capability: AVX2" in _fresh("import runpy, sys; sys.argv = ['run_all.py', '--list']; "
                                        "runpy.run_path('run_all.py', run_name='not_main'); import torch; "
                                        "print('capability:', torch.backends.cpu.get_cpu_capability())")


def test_portable_numerics_leaves_loaded_torch_the_user_and_native_alone():
    assert "set: {}" in _fresh("import torch; " + PIN)  # too late: torch chose already, nothing claims otherwise
    out = _fresh(PIN, ATEN_CPU_CAPABILITY="default")  # the user's value wins
    assert "'ATEN_CPU_CAPABILITY': 'default'" in out and "capability: DEFAULT" in out, out
    assert "set: {}" in _fresh(PIN, ATTNLIP_NATIVE_ISA="1")


def test_the_test_process_holds_the_pin_run_all_holds():
    """Tests that recompute committed numbers do so in this process (tests/conftest.py pins it before torch loads,
    as run_all.py does). Fails when the pin is lost (torch imported first by a plugin or an import moved above it),
    so a committed-number test can never silently run other kernels than the ones it is compared with."""
    from tests import conftest

    assert not conftest.TORCH_LOADED_BEFORE_PIN, "torch was imported before tests/conftest.py could pin its kernels"
    if not config._has_avx2():
        assert conftest.PINNED == {}
        return
    cap = torch.backends.cpu.get_cpu_capability()
    if os.environ.get(config.NATIVE_ISA_ENV, "") not in ("", "0"):
        assert config.committed_kernels_differ() is None or "ATTNLIP_NATIVE_ISA=1" in config.committed_kernels_differ()
        return
    want = conftest.PINNED["ATEN_CPU_CAPABILITY"]  # avx2 unless the user exported another value, which wins
    assert cap == want.upper(), (cap, conftest.PINNED)
    assert (config.committed_kernels_differ() is None) == (cap == config.COMMITTED_CAPABILITY)


def test_manifests_record_the_code_paths():
    from harness import manifest

    got = manifest.environment("cpu")["numerics"]
    assert set(got) == {*config.PORTABLE_ISA, "torch_cpu_capability"}
    assert got["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
