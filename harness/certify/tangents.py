"""Exact Jacobians of every prefix of a chain with respect to the few input rows that may move (one word's
embedding), for the network route (docs/math.md §6).

When only k rows of the input move, the prefix f_k o ... o f_1 has a Jacobian with k d columns: small enough to
compute exactly. Forward-mode automatic differentiation (dual numbers) pushes all k d unit tangents through the
chain, one block at a time, in float64; the spectral norm of each prefix Jacobian N_k is the square root of the
largest eigenvalue of its (k d) x (k d) Gram matrix. These norms replace products of per-block norms in the
radius of every block's input ball (harness.certify.network).
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.autograd.forward_ad as fwAD

from harness.certify.block import Rows, Trace

Tensor = torch.Tensor
MAX_COLUMNS = 4096  # at most this many input coordinates (k d) get exact prefix Jacobians
CHUNK = 256  # tangents pushed through a block at once
ROUNDING = 1e-10  # relative allowance on each float64 norm


def _push(block, X: Tensor, T: Tensor) -> Tensor:
    """J_f(X) applied to each tangent: (c, n, d) -> (c, n', d'), by forward-mode AD on a batch of copies of X."""
    out = []
    for i in range(0, T.shape[0], CHUNK):
        t = T[i:i + CHUNK]
        with fwAD.dual_level():
            dual = fwAD.make_dual(X.expand(t.shape[0], *X.shape).contiguous(), t.contiguous())
            out.append(fwAD.unpack_dual(block.forward(dual)).tangent)
    return torch.cat(out)


def _norm(T: Tensor) -> float:
    """Spectral norm of the Jacobian whose columns are the tangents T (c, n, d)."""
    flat = T.reshape(T.shape[0], -1)
    gram = flat @ flat.T  # (c, c)
    return float(torch.linalg.eigvalsh(gram)[-1].clamp_min(0.0).sqrt()) * (1 + ROUNDING)


def prefix_norms(trace: Trace, rows: Rows) -> Optional[List[float]]:
    """N_k = ||d X_k / d x_rows|| for every step input X_k and the chain's output (K + 1 values, N_0 = 1), or None
    when every row may move or the rows have too many coordinates (then the layer-by-layer radii are used)."""
    if rows is None or not trace.steps:
        return None
    X0 = trace.steps[0].X
    idx = list(rows)
    cols = len(idx) * X0.shape[-1]
    if cols > MAX_COLUMNS:
        return None
    T = torch.zeros(cols, *X0.shape, dtype=X0.dtype, device=X0.device)
    eye = torch.eye(cols, dtype=X0.dtype, device=X0.device).reshape(cols, len(idx), X0.shape[-1])
    T[:, idx] = eye
    norms = [1.0]
    for s in trace.steps:
        T = _push(s.block, s.X, T)
        norms.append(_norm(T))
    return norms
