"""One input state of the bound registry: (X, w, causal) validated and cast once, and the quantities several
bounds share (attention maps, norms, LoFAST's power iterations, the true per-head and per-layer local Lipschitz
constants) computed lazily, once. harness.bounds.registry.evaluate builds one per input.
"""
from __future__ import annotations

import functools
from typing import Dict, Iterable, Optional

import torch

from harness.bounds import jasmin, lofast, lofast_refined
from harness.kernels.attention import AttentionWeights, check_input, probs
from harness.kernels.layer import truth
from harness.kernels.linalg import spec

Tensor = torch.Tensor


class InputState:
    """(X, w, causal) validated and cast once, with the quantities several bounds share computed lazily once.

    X: (..., n, d); w is moved to X's dtype and device. Power iterations use `tol` (None: the dtype's default,
    harness.settings) and at most `iters` operator applications; their convergence flags are kept
    (`converged`). certify: None, or dict(steps=..., fail_prob=..., seed=...): the truths then start from a seeded
    Gaussian and also give the KW certified upper estimate (`upper[scope]`, kernels.layer.certified_norm).
    """

    def __init__(self, X: Tensor, w: AttentionWeights, causal: bool = False, tol: Optional[float] = None,
                 iters: int = 2000, certify: Optional[dict] = None):
        if not isinstance(w, AttentionWeights):
            raise ValueError(f"w must be an AttentionWeights, got {type(w).__name__}")
        check_input(X, w.d)
        if w.dtype != X.dtype or w.device != X.device:
            w = w.to(dtype=X.dtype, device=X.device)
        self.X, self.w, self.causal = X.detach(), w, bool(causal)
        self.tol, self.iters = tol, int(iters)
        self.converged: Dict[str, Tensor] = {}  # quantity -> (...,) bool of its power iterations
        self.certify = None if certify is None else dict(certify)
        self.upper: Dict[str, Tensor] = {}  # scope -> certified upper estimate of the truth (certify only)

    @property
    def power(self) -> dict:
        return dict(tol=self.tol, iters=self.iters, on_nonconvergence="ignore")

    @functools.cached_property
    def P(self) -> Tensor:
        """Attention maps (..., h, n, n) (biases and mask included; the Remark 2 layer has the same maps)."""
        return probs(self.X, self.w, self.causal)

    @functools.cached_property
    def P_norm(self) -> Tensor:
        """||P_l|| (..., h): sqrt of the top eigenvalue of P_l P_l^T (symmetric eigensolver, values only), equal
        to the SVD's sigma_max to rounding (relative 1e-15 at n = 512) and ~4x faster than the SVD at n = 512."""
        P = self.P
        if P.dtype not in (torch.float32, torch.float64):  # no symmetric eigensolver below float32
            return spec(P)
        return torch.linalg.eigvalsh(P @ P.transpose(-1, -2))[..., -1].clamp_min(0).sqrt()

    @functools.cached_property
    def VO_norm(self) -> Tensor:
        """||VO_l|| (h,) of the unaugmented weights (bv cancels in every Delta_1-type term)."""
        return self.w.VO_norm()

    @functools.cached_property
    def jasmin_terms(self) -> dict:
        """JaSMin Theorem 3's factors (harness.bounds.jasmin.bound_terms) with the shared P and ||P_l||."""
        return jasmin.bound_terms(self.X, self.w, self.causal, P=self.P, P_norm=self.P_norm)

    @functools.cached_property
    def value_norm(self) -> Tensor:
        """||(X wv_l + bv_l) wo_l|| (..., h) (LoFAST's ||X VO_l||)."""
        return lofast.delta22(self.X, self.w, 0.0)

    @functools.cached_property
    def zeta(self) -> Tensor:
        """LoFAST Lemma 1 (no residual, masked P when causal): (...,); its eq. 9 cap reads the cached ||P_l||."""
        z, info = lofast.zeta(self.X, self.w, residual=False, causal=self.causal, return_info=True,
                              P_norm=self.P_norm, **self.power)
        self.converged["zeta"] = info.converged
        return z

    @functools.cached_property
    def m_fine(self) -> Tensor:
        """LoFAST Lemma 2, exact ||M_l(X)||: (..., h)."""
        m, info = lofast.m_norms(self.X, self.w, return_info=True, **self.power)
        self.converged["m"] = info.converged
        return m

    @functools.cached_property
    def m_coarse(self) -> Tensor:
        """LoFAST eq. 21, xi_l: (..., h)."""
        return lofast.xi(self.X, self.w)

    @functools.cached_property
    def row_terms(self) -> lofast_refined.RowTerms:
        """The per-row softmax terms of the "refined" and second-order certificates (lofast_refined.row_terms)."""
        return lofast_refined.row_terms(self.X, self.w, self.causal)

    def _truth(self, heads: bool):
        """kernels.layer.truth at this state: the one truth of the registry, analyze and the Castin experiments."""
        c = dict(self.certify or {})
        seed = c.pop("seed", 0)
        res = truth(self.X, self.w, self.causal, heads, self.tol, self.iters, seed, c or None)
        return res.value, res.converged, res.upper

    @functools.cached_property
    def truth_head(self) -> Tensor:
        """||J_{f_l}(X)|| per head (Lanczos on every head at once, on the reduced heads): (..., h)."""
        value, conv, upper = self._truth(heads=True)
        self.converged["truth_head"] = conv.all(-1)
        if self.certify is not None:
            self.upper["head"] = upper
        return value

    @functools.cached_property
    def truth_layer(self) -> Tensor:
        """||J_F(X)|| of the whole layer (no residual): (...,)."""
        value, self.converged["truth_layer"], upper = self._truth(heads=False)
        if self.certify is not None:
            self.upper["layer"] = upper
        return value

    def all_converged(self, keys: Iterable[str]) -> Tensor:
        out = torch.ones(self.X.shape[:-2], dtype=torch.bool, device=self.X.device)
        for k in keys:
            if k in self.converged:
                out = out & self.converged[k]
        return out
