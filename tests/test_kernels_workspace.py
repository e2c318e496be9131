"""The Lanczos basis buffer kept between solver calls (harness.kernels.lanczos_steps.basis_buffer): reused on the
CPU, never shared with a run still going, given back when a run fails, per thread, bounded in size, dropped by
harness.process.release_freed_memory; and reuse changes no value."""
from __future__ import annotations

import threading

import pytest
import torch

from harness import process
from harness.bounds import lofast as L
from harness.bounds.lofast_ops import m_gram
from harness.kernels import krylov, lanczos_steps
from harness.kernels.attention import AttentionWeights
from harness.kernels.lanczos_steps import basis_buffer, release_workspace
from harness.kernels.operators import MGram

DT = torch.float64


@pytest.fixture(autouse=True)
def fresh_workspace():
    release_workspace()
    yield
    release_workspace()


def ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_a_finished_runs_buffer_is_reused_and_grows_when_too_small():
    V, done = basis_buffer(2, 5, 100, DT, torch.device("cpu"))
    assert V.shape == (2, 5, 100) and V.dtype == DT
    first = ptr(V)
    done()
    W, done = basis_buffer(3, 4, 50, DT, "cpu")  # smaller: the same memory
    assert ptr(W) == first and W.shape == (3, 4, 50)
    done()
    big, done = basis_buffer(4, 5, 100, DT, "cpu")  # larger: a new buffer, kept from then on
    done()
    again, done = basis_buffer(4, 5, 100, DT, "cpu")
    assert ptr(again) == ptr(big)
    done()
    other, done = basis_buffer(2, 5, 100, torch.float32, "cpu")  # one buffer for every dtype
    assert ptr(other) == ptr(big) and other.dtype == torch.float32 and other.shape == (2, 5, 100)
    done()


def test_a_buffer_in_use_is_never_handed_out_twice():
    V, done = basis_buffer(2, 5, 100, DT, "cpu")
    W, done_w = basis_buffer(2, 5, 100, DT, "cpu")  # a solver run inside the first one's operator
    assert ptr(W) != ptr(V)
    done_w()
    X, done_x = basis_buffer(2, 5, 100, DT, "cpu")  # the first still runs
    assert ptr(X) != ptr(V)
    done_x()
    done()
    Y, done = basis_buffer(2, 5, 100, DT, "cpu")
    assert ptr(Y) == ptr(V)
    done()


def test_other_threads_large_bases_and_other_devices_get_their_own(monkeypatch):
    V, done = basis_buffer(2, 5, 100, DT, "cpu")
    done()
    seen = []
    t = threading.Thread(target=lambda: seen.append(ptr(basis_buffer(2, 5, 100, DT, "cpu")[0])))
    t.start()
    t.join()
    assert seen and seen[0] != ptr(V)
    monkeypatch.setattr(lanczos_steps, "WORKSPACE_BYTES", 2 * 5 * 100 * 8 - 1)  # one byte short
    W, done = basis_buffer(2, 5, 100, DT, "cpu")
    assert ptr(W) != ptr(V)
    done()
    M, done = basis_buffer(2, 5, 100, DT, torch.device("meta"))  # not the CPU: torch's own allocator
    assert M.device.type == "meta"
    done()


def test_release_drops_the_buffer_and_the_runner_releases_it():
    V, done = basis_buffer(2, 5, 100, DT, "cpu")
    done()
    kept = V.untyped_storage()
    del V
    process.release_freed_memory()
    assert lanczos_steps._WORKSPACE.buf is None
    W, done = basis_buffer(2, 5, 100, DT, "cpu")
    assert W.untyped_storage() is not kept
    done()


def case(seed=0, batch=3, n=6, d=8, h=2):
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d, h, dtype=DT, generator=g)
    return torch.randn(batch, n, d, dtype=DT, generator=g), w


def m_op(X, w):
    return m_gram(X, w)[0]


def test_a_run_that_fails_gives_its_buffer_back():
    X, w = case()
    op = m_op(X, w)
    calls = []

    class Failing(MGram):
        def gram(self, V):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("operator failed")
            return super().gram(V)
    bad = Failing.__new__(Failing)
    bad.__dict__.update(op.__dict__)
    x0 = torch.randn(op.scale.shape[0], op.dim, dtype=DT, generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="operator failed"):
        krylov.lanczos(bad, x0, tol=1e-12, krylov=8)
    assert not lanczos_steps._WORKSPACE.busy
    V, done = basis_buffer(1, 1, 8, DT, "cpu")
    assert ptr(V) == ptr(lanczos_steps._WORKSPACE.buf)
    done()


def test_reuse_changes_no_value(monkeypatch):
    """Lanczos on a reused (dirty) buffer gives bitwise the values, vectors and certificates of fresh memory,
    restarts and deflation included."""
    X, w = case(batch=4, n=9, d=12, h=3)
    op = m_op(X, w)
    x0 = torch.randn(op.scale.shape[0], op.dim, dtype=DT, generator=torch.Generator().manual_seed(2))
    run = lambda: krylov.lanczos(op, x0, tol=1e-13, krylov=6, fail_prob=1e-6)
    V, done = basis_buffer(op.scale.shape[0], 7, op.dim, DT, "cpu")  # the run's basis: 6 vectors + 1
    V.fill_(float("nan"))  # what an earlier run might have left
    done()
    reused = [run()]
    assert ptr(basis_buffer(1, 1, 1, DT, "cpu")[0]) == ptr(V)  # the run used (and gave back) that buffer
    lanczos_steps._WORKSPACE.busy = False
    reused.append(run())
    monkeypatch.setattr(lanczos_steps, "WORKSPACE_BYTES", 0)
    fresh = run()
    for r in reused:
        assert r.steps.tolist() == fresh.steps.tolist()
        for a, b in ((r.value, fresh.value), (r.vector, fresh.vector), (r.upper, fresh.upper)):
            assert torch.equal(a, b)
    m1, m2 = L.m_norms(X, w), L.m_norms(X, w)
    assert torch.equal(m1, m2)
