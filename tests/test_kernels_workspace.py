"""The Lanczos basis buffer kept between solver calls (harness.kernels.lanczos_steps.basis_buffer): reused on the
CPU, never shared with a run still going, given back when a run fails, per thread, bounded in size, dropped by
harness.process.release_freed_memory; and reuse changes no value."""
from __future__ import annotations

import threading
import weakref

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
    kept = weakref.ref(lanczos_steps._WORKSPACE.buf)
    del V
    process.release_freed_memory()
    assert lanczos_steps._WORKSPACE.buf is None and kept() is None  # nothing holds the memory any more


def case(seed=0, batch=3, n=6, d=8, h=2):
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d, h, dtype=DT, generator=g)
    return torch.randn(batch, n, d, dtype=DT, generator=g), w


def problem(seed: int, **shape):
    """(X, w, the reduced ||M_l|| operators of every input and head, a seeded Gaussian start for them)."""
    X, w = case(**shape)
    op = m_gram(X, w)[0]
    x0 = torch.randn(op.scale.shape[0], op.dim, dtype=DT, generator=torch.Generator().manual_seed(seed))
    return X, w, op, x0


def given_back():
    """The last run gave the kept buffer back: the next request gets that very buffer."""
    assert not lanczos_steps._WORKSPACE.busy
    V, done = basis_buffer(1, 1, 8, DT, "cpu")
    assert ptr(V) == ptr(lanczos_steps._WORKSPACE.buf)
    done()


def test_a_run_that_fails_gives_its_buffer_back():
    _, _, op, x0 = problem(1)
    calls = []

    class Failing(MGram):
        def gram(self, V):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("operator failed")
            return super().gram(V)
    bad = Failing.__new__(Failing)
    bad.__dict__.update(op.__dict__)
    with pytest.raises(RuntimeError, match="operator failed"):
        krylov.lanczos(bad, x0, tol=1e-12, krylov=8)
    given_back()


def test_a_run_that_fails_while_starting_gives_its_buffer_back(monkeypatch):
    _, _, op, x0 = problem(1)
    real = torch.Tensor.__setitem__

    def failing(self, key, value):
        if self.untyped_storage().data_ptr() == ptr(lanczos_steps._WORKSPACE.buf):
            raise MemoryError("the start could not be written")
        return real(self, key, value)
    krylov.lanczos(op, x0, tol=1e-12, krylov=8)  # the buffer exists
    monkeypatch.setattr(torch.Tensor, "__setitem__", failing)
    with pytest.raises(MemoryError):
        krylov.lanczos(op, x0, tol=1e-12, krylov=8)
    monkeypatch.undo()
    given_back()


def dirty():
    """Fill this thread's kept buffer with NaN: what an earlier run might have left."""
    buf = lanczos_steps._WORKSPACE.buf
    buf.view(DT)[: buf.numel() // 8].fill_(float("nan"))


@pytest.mark.parametrize("shape,reorth", [((4, 9, 12, 3), "full"), ((4, 9, 12, 3), "partial"),
                                          ((1, 64, 128, 2), "auto")])  # the last: N = 8,192, the lean path
def test_reuse_changes_no_value(monkeypatch, shape, reorth):
    """Lanczos on a reused (NaN-filled) buffer gives bitwise the values, vectors and certificates of fresh memory,
    restarts and deflation included."""
    batch, n, d, h = shape
    X, w, op, x0 = problem(2, batch=batch, n=n, d=d, h=h)
    run = lambda: krylov.lanczos(op, x0, tol=1e-13, krylov=6, fail_prob=1e-6, reorth=reorth)
    first = run()
    reused = []
    for _ in range(2):
        dirty()
        reused.append(run())
        given_back()
    monkeypatch.setattr(lanczos_steps, "WORKSPACE_BYTES", 0)
    fresh = run()
    assert int(fresh.products) > 6  # restarted
    for r in [first] + reused:
        assert r.steps.tolist() == fresh.steps.tolist() and r.products == fresh.products
        for a, b in ((r.value, fresh.value), (r.vector, fresh.vector), (r.upper, fresh.upper)):
            assert torch.equal(a, b)
    m1, m2 = L.m_norms(X, w), L.m_norms(X, w)
    assert torch.equal(m1, m2)
