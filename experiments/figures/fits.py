"""Log-log power-law fits of the Castin presentation modules (experiments/castin/figures/): the slope of log y on log n with
its confidence interval, and its one-line summary form."""
from __future__ import annotations

from typing import Dict

import numpy as np


def loglog_fit(n, y, level: float = 0.95) -> Dict[str, float]:
    """OLS of log y on log n: slope with a t-based `level` CI, constant C of y ~ C n^slope, and the constant of
    y ~ C05 sqrt(n) (fixed slope 1/2, geometric mean of y / sqrt(n)). Non-positive / non-finite points dropped."""
    from scipy import stats

    n, y = np.asarray(n, float), np.asarray(y, float)
    ok = (n > 0) & (y > 0) & np.isfinite(n) & np.isfinite(y)
    x, ly = np.log(n[ok]), np.log(y[ok])
    out = dict(slope=np.nan, slope_lo=np.nan, slope_hi=np.nan, const=np.nan, const_sqrt=np.nan,
               r2=np.nan, points=int(ok.sum()))
    if ok.sum() >= 1:
        out["const_sqrt"] = float(np.exp(np.mean(ly - 0.5 * x)))
    if ok.sum() < 3 or np.ptp(x) == 0:
        return out
    res = stats.linregress(x, ly)
    t = stats.t.ppf(0.5 + level / 2, ok.sum() - 2)
    out.update(slope=float(res.slope), slope_lo=float(res.slope - t * res.stderr),
               slope_hi=float(res.slope + t * res.stderr), const=float(np.exp(res.intercept)),
               r2=float(res.rvalue ** 2))
    return out


def fmt_fit(f: Dict[str, float]) -> str:
    """'0.48 [0.45, 0.51]' (slope and CI) for summaries."""
    if not np.isfinite(f.get("slope", np.nan)):
        return "n/a"
    return f"{f['slope']:.2f} [{f['slope_lo']:.2f}, {f['slope_hi']:.2f}]"
