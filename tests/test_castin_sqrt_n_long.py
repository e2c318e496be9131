"""castin_sqrt_n's `long` grid (experiments/castin/sqrt_n_long.py): planned, not run. Up to n = 8192 every cell
fits 8 GiB with streamed products (float32 basis at 8192), 16k and 32k need the GPU's memory."""
from __future__ import annotations

from experiments.castin import sqrt_n_long as L

GiB = 2**30


def test_long_grid_fits_8_gib_to_8192():
    rows = L.plan(L.LONG, 8 * GiB, 20e9)
    assert [r["n"] for r in rows] == [1024, 2048, 4096, 8192]
    assert all(r["fits"] and r["memory"] <= 8 * GiB for r in rows)
    assert all(r["route"] == "streamed" for r in rows if r["n"] >= 2048)
    last = rows[-1]
    assert "float32" in last["basis"] and last["seconds"] > 3600  # an hour or more at 20 GFLOP/s


def test_long_gpu_grid_needs_the_gpu():
    small = {r["n"]: r for r in L.plan(L.LONG_GPU, 8 * GiB, 1e12)}
    assert not small[16384]["fits"] and not small[32768]["fits"] and "basis needs" in small[32768]["basis"]
    big = L.plan(L.LONG_GPU, 130 * GiB, 1e12)
    assert all(r["fits"] for r in big) and max(r["n"] for r in big) == 32768
