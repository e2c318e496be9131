"""Tests of the benchmark reports and their timing (benchmarks.timing, report, floor, threads, mixed_refine) at
tiny sizes: each report runs, fills its columns and measures what it says it does. Plain tests (no timing asserted
beyond what the helpers promise); the timed kernel cases are benchmarks.bench_kernels.
"""
from __future__ import annotations

import pytest
import torch

from benchmarks.cases import arpack_zeta, case, dense_zeta, rel_diff
from harness.bounds import lofast as L


def test_report_repeats_millisecond_calls_for_a_steady_median():
    """benchmarks.timing.measure: a call faster than FAST_CALL after its warm-up is repeated FAST_REPEATS times (a
    no-op: 1 s / its time is far above), a slower one `repeats` times; the warm-up is not among the times."""
    import time as _time

    from benchmarks.timing import FAST_CALL, FAST_REPEATS, measure

    calls = []
    val, t = measure(lambda: calls.append(1) or 7, 3, True)
    assert val == 7 and len(calls) == 1 + FAST_REPEATS and t < FAST_CALL
    calls.clear()
    _, t = measure(lambda: calls.append(1) or _time.sleep(FAST_CALL * 1.2), 3, True)
    assert len(calls) == 1 + 3 and t >= FAST_CALL
    calls.clear()
    measure(lambda: calls.append(1), 2, False)  # no warm-up: exactly the repeats asked for
    assert len(calls) == 2


def test_compared_calls_take_turns():
    """benchmarks.timing.measure_alternating: after one warm-up each, the timed calls come in rounds, one block of
    each callable per round (as many rounds as the slow one's `repeats`; the fast one's FAST_REPEATS calls spread
    evenly over them), each median is over its own calls only, and each value is its callable's."""
    import time as _time

    from benchmarks.timing import FAST_CALL, FAST_REPEATS, measure_alternating

    order = []
    slow = lambda: order.append("slow") or _time.sleep(FAST_CALL * 1.2) or "s"
    out = measure_alternating({"fast": lambda: order.append("fast") or "f", "slow": slow}, 3)
    block = ["fast"] * (FAST_REPEATS // 3) + ["slow"]
    assert order == ["fast", "slow"] + block * 3  # the warm-ups, then three rounds
    assert out["fast"][0] == "f" and out["fast"][1] < FAST_CALL
    assert out["slow"][0] == "s" and out["slow"][1] >= FAST_CALL


def test_arpack_reports_its_products():
    """The floor report's ARPACK columns count and time ARPACK's operator calls; the value is the dense one."""
    X, w = case("tiny")
    calls = []
    val = arpack_zeta(X, w, calls=calls)
    kinds = [c[0] for c in calls]
    # one Gram product = a matvec and an rmatvec; svds adds one matvec after the iteration
    assert kinds.count("rmv") >= 1 and 0 <= kinds.count("mv") - kinds.count("rmv") <= 1
    assert all(c[1] >= 0 for c in calls)
    assert rel_diff(val, dense_zeta(X, w)) <= 1e-6


def test_floor_report_runs():
    """`python -m benchmarks.report --part floor` at the tiny sizes, one input and a batch: a row each, every column
    filled."""
    from benchmarks.floor import floor_report

    rows = [l for l in floor_report(["tiny", "tinybatch"], 1).splitlines() if l.startswith("| n=6 d=8 h=2")]
    assert len(rows) == 2 and "5 inputs" in rows[1]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 11 and all(cells), cells
        assert int(cells[2]) >= 1 and float(cells[6].split()[0]) >= 1  # our products, ARPACK's products
        assert cells[9].endswith("x") and cells[10].endswith("x")  # the ratios our products allow


@pytest.fixture
def report_threads():
    """benchmarks.report with torch's thread count and the BLAS pools given back after the test."""
    import benchmarks.report as R
    from benchmarks.timing import restore_threads

    before = torch.get_num_threads()
    yield R
    torch.set_num_threads(before)
    restore_threads()


def test_report_threads_apply_to_torch_and_blas(capsys, monkeypatch, report_threads):
    """`--threads 1,2`: one table per count in the same run, and during each pass torch's AND numpy's BLAS thread
    counts are that count (ARPACK runs on numpy: an unset BLAS pool would give it another count than ours); the BLAS
    pools get their original counts back afterwards."""
    from threadpoolctl import threadpool_info
    from benchmarks.timing import restore_threads

    R = report_threads
    blas = lambda: sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
    seen, original = [], blas()
    monkeypatch.setattr(R, "floor_report", lambda sizes, repeats: seen.append((torch.get_num_threads(), blas()))
                        or "| row |")
    R.main(["--part", "floor", "--quick", "--repeats", "1", "--threads", "1,2"])
    out = capsys.readouterr().out
    assert "### 1 thread (torch and BLAS)" in out and "### 2 threads (torch and BLAS)" in out
    assert seen == [(1, [1]), (2, [2])]
    for bad in (["--part", "analyze", "--threads", "1,2"], ["--threads", "0"], ["--threads", "2,2"],
                ["--threads", "x"]):
        with pytest.raises(SystemExit):
            R.main(bad)
    restore_threads()
    assert blas() == original


def test_best_of_report_pairs_each_side_at_its_own_best_count(capsys, report_threads):
    """The fair ratio: ours (routed by size, as shipped) and ARPACK each at the thread count where they were fastest,
    from the same run; the torch-solver-only column does not enter it."""
    R = report_threads
    row = lambda o, r, a: dict(size="n=6 d=8 h=2", quantity="zeta", ours=o, torch=r, arpack=a, dense=float("nan"),
                               rel=0.0, ref="dense")
    table = R.best_of_report({1: [row(4.0, 3.0, 1.0)], 2: [row(2.0, 2.5, 6.0)]})
    assert "| n=6 d=8 h=2 | zeta | 2 at 2 | 1 at 1 | 0.5x |" in table
    table = R.best_of_report({1: [row(1.6, 1.0, 1.0)], 2: [row(2.0, 0.5, 6.0)]})  # the torch-only column: ignored
    assert "| n=6 d=8 h=2 | zeta | 1.6 at 1 | 1 at 1 | 0.6x |" in table
    targets = R.targets_report({1: [dict(row(4.0, 3.0, 9.0), key="small"), dict(row(1.0, 1.0, 1.0), key="tiny")],
                                2: [dict(row(2.0, 2.5, 6.0), key="small"), dict(row(1.0, 1.0, 1.0), key="tiny")]})
    assert "| n=6 d=8 h=2 | zeta | 3.00x | 1.5x | yes |" in targets and targets.count("| zeta |") == 1
    assert "| 1.00x | 5x | no |" in R.targets_report({1: [dict(row(1.0, 1.0, 1.0), key="batch")]})
    R.main(["--part", "kernels", "--quick", "--repeats", "1", "--threads", "1,2"])
    out = capsys.readouterr().out
    assert "### Each side at its best thread count" in out and out.count("| n=6 d=8 h=2 | zeta |") == 3


def test_mixed_refine_prototype_meets_the_float64_tolerance_explicitly():
    """benchmarks.mixed_refine (a measured prototype, not a product route): values equal the float64 route's to
    rounding, and its explicit float64 residual is below tol, row by row."""
    from benchmarks import mixed_refine

    rows = mixed_refine.compare("tinybatch", repeats=1)
    assert [r[0] for r in rows] == ["zeta", "‖M_l‖ all heads"] and all(r[3] < 1e-12 for r in rows)
    X, w = case("small")
    log: list = []
    with mixed_refine.prototype_route(log, 1e-5):
        v, info = L.zeta(X, w, tol=1e-10, mixed=True, return_info=True)
    assert bool(info.zeta.converged.all()) and float(info.zeta.rel_change.max()) < 1e-10
    torch.testing.assert_close(v, L.zeta(X, w, tol=1e-10), rtol=1e-12, atol=0)
    assert len(log) == 1 and "float32" in log[0]
    assert L.lanczos_mixed is mixed_refine.mixed.lanczos_mixed  # the block restores lofast's route
