"""One input state of the bound registry: (X, w, causal) validated and cast once, and the quantities several
bounds share (attention maps, norms, LoFAST's power iterations, the true per-head and per-layer local Lipschitz
constants) computed lazily, once. harness.bounds.registry.evaluate builds one per input.
"""
from __future__ import annotations

import functools
from typing import Dict, Iterable, Optional

import torch

from harness.bounds import jasmin, lofast, lofast_refined, second_order
from harness.kernels.attention import AttentionWeights, check_input, probs
from harness.kernels.layer import truth
from harness.kernels.linalg import spec
from harness.settings import CERTIFY_EPS, CERT_ROUNDING, FAIL_PROB, ITERS, dtype_name

Tensor = torch.Tensor


class InputState:
    """(X, w, causal) validated and cast once, with the quantities several bounds share computed lazily once.

    X: (..., n, d); w is moved to X's dtype and device. Power iterations use `tol` (None: the dtype's default,
    harness.settings) and at most `iters` operator applications; their convergence flags are kept
    (`converged`). certify: None, or dict(steps=..., fail_prob=..., seed=...): certifying mode. The truths then
    also give the KW certified upper estimate (`upper[scope]`, kernels.layer.certified_norm), and so do zeta and
    ||M_l|| (`upper["zeta"]`, `upper["m"]`, their first Lanczos cycle run for settings.CERTIFY_EPS); every
    ball-change certificate then reads these upper estimates (`zeta_cert`, `m_cert`), never a Ritz value, and is
    padded by the rounding allowance `rounding_allowance`. Without certify the certificates read the Lanczos values
    (estimates, to the solvers' tolerance). Every Lanczos start is hashed from X and the weights
    (harness.kernels.starts).
    """

    def __init__(self, X: Tensor, w: AttentionWeights, causal: bool = False, tol: Optional[float] = None,
                 iters: int = ITERS, certify: Optional[dict] = None, cast: bool = False):
        if not isinstance(w, AttentionWeights):
            raise ValueError(f"w must be an AttentionWeights, got {type(w).__name__}")
        check_input(X, w.d)
        self.cast: Optional[str] = None  # "float64 -> float32" when cast=True rounded the weights to X's dtype
        if w.dtype != X.dtype and torch.finfo(w.dtype).bits > torch.finfo(X.dtype).bits:
            if not cast:
                raise ValueError(f"the weights are {dtype_name(w.dtype)} and X is {dtype_name(X.dtype)}: the bounds "
                                 f"would round the weights silently. Pass X in the weights' dtype, or cast=True to "
                                 f"round the weights to X's dtype (recorded in InputState.cast)")
            self.cast = f"{dtype_name(w.dtype)} -> {dtype_name(X.dtype)}"
        if w.dtype != X.dtype or w.device != X.device:  # a lossless widening (or a device move) otherwise
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
    def value_norm_centered(self) -> Tensor:
        """||(X - 1 xbar) wv_l wo_l|| (..., h): what multiplies a change of P_l, whose rows sum to 0 (ours)."""
        return lofast.centered_value_norm(self.X, self.w)

    @property
    def _certify_power(self) -> dict:
        """The Lanczos settings of zeta and ||M_l||: in certifying mode a first cycle long enough for CERTIFY_EPS and
        the state's fail_prob and seed."""
        if self.certify is None:
            return self.power
        c = self.certify
        return dict(self.power, certify_eps=CERTIFY_EPS, fail_prob=float(c.get("fail_prob", FAIL_PROB)),
                    seed=int(c.get("seed", 0)))

    @functools.cached_property
    def zeta(self) -> Tensor:
        """LoFAST Lemma 1 (no residual, masked P when causal): (...,); its eq. 9 cap reads the cached ||P_l||."""
        z, info = lofast.zeta(self.X, self.w, residual=False, causal=self.causal, return_info=True,
                              P_norm=self.P_norm, **self._certify_power)
        self.converged["zeta"] = info.converged
        if self.certify is not None:
            self.upper["zeta"] = info.zeta.upper
        return z

    @functools.cached_property
    def m_fine(self) -> Tensor:
        """LoFAST Lemma 2, exact ||M_l(X)||: (..., h)."""
        m, info = lofast.m_norms(self.X, self.w, return_info=True, **self._certify_power)
        self.converged["m"] = info.converged
        if self.certify is not None:
            self.upper["m"] = info.m.upper
        return m

    @property
    def zeta_cert(self) -> Tensor:
        """What a certificate reads for zeta: its certified upper estimate in certifying mode, else the value."""
        z = self.zeta
        return self.upper["zeta"] if self.certify is not None else z

    @property
    def m_cert(self) -> Tensor:
        """What a certificate reads for ||M_l||: its certified upper estimate in certifying mode, else the value."""
        m = self.m_fine
        return self.upper["m"] if self.certify is not None else m

    @property
    def rounding_allowance(self) -> float:
        """The factor a certificate is padded by in certifying mode, 1 + CERT_ROUNDING (n + d) eps (settings); 1
        otherwise."""
        if self.certify is None:
            return 1.0
        n, d = self.X.shape[-2:]
        return 1.0 + CERT_ROUNDING * (n + d) * torch.finfo(self.X.dtype).eps

    @functools.cached_property
    def m_coarse(self) -> Tensor:
        """LoFAST eq. 21, xi_l: (..., h)."""
        return lofast.xi(self.X, self.w)

    @functools.cached_property
    def row_terms(self) -> lofast_refined.RowTerms:
        """The per-row softmax terms of the "refined" and second-order certificates (lofast_refined.row_terms)."""
        return lofast_refined.row_terms(self.X, self.w, self.causal)

    @functools.cached_property
    def curvature(self) -> second_order.CurvatureTerms:
        """The ingredients of the second-order certificate's curvature bound K(eps) (harness.bounds.second_order)
        at the state, from what a certificate reads for ||M_l|| (m_cert): computed once, read at every eps."""
        return second_order.curvature_terms(self.X, self.w, self.m_cert, self.causal,
                                            xvo=self.value_norm_centered, rows=self.row_terms)

    def _truth(self, heads: bool, residual: bool = False):
        """kernels.layer.truth at this state: the one truth of the registry, analyze and the Castin experiments."""
        c = dict(self.certify or {})
        seed = c.pop("seed", 0)
        res = truth(self.X, self.w, self.causal, heads, self.tol, self.iters, seed,
                    None if self.certify is None else c, residual=residual)  # certify={}: with the defaults
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

    @functools.cached_property
    def truth_residual(self) -> Tensor:
        """||I + J_F(X)|| of the residual layer X + F(X) (certifying mode only; its certified upper estimate is
        upper["residual"]): what the second-order certificate of the residual map reads."""
        if self.certify is None:
            raise ValueError("the residual layer's constant is computed in certifying mode: InputState(certify={})")
        value, self.converged["truth_residual"], self.upper["residual"] = self._truth(heads=False, residual=True)
        return value

    def all_converged(self, keys: Iterable[str]) -> Tensor:
        out = torch.ones(self.X.shape[:-2], dtype=torch.bool, device=self.X.device)
        for k in keys:
            if k in self.converged:
                out = out & self.converged[k]
        return out
