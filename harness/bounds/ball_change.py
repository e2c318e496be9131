"""Theorem 1's finite-eps certificates as registry entries: bounds on the change of the attention layer over an
eps-ball, delta(X, eps) >= sup_{||X' - X||_F <= eps} ||F(X') - F(X)||_F (what certification propagates).

Every variant is Theorem 1's polynomial (lofast.theorem1) with its own ingredients:

    naive    eq. 9's Delta_1 coefficient, xi_l (eq. 21), c = 1     (the paper's eq. 23 with eq. 9)
    coarse   zeta (Lemma 1), xi_l, c = 1                           (the paper's practical choice)
    fine     zeta, the exact ||M_l|| (Lemma 2), c = 1
    sharp    zeta, ||M_l||, c = 1/2 (JaSMin Cor. 1)
    refined  zeta, ||M_l||, the per-ball c_l(eps) <= 1/2 of harness.bounds.lofast_refined

`Theorem1Variant.delta` evaluates one variant from the ingredients (certification passes its certified upper
estimates of zeta and ||M_l||); `Theorem1Variant.at_state` from an InputState (the registry's map, no residual).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from harness.bounds import lofast, lofast_refined

Tensor = torch.Tensor


@dataclass(frozen=True)
class Theorem1Variant:
    """Which ingredients of Theorem 1 a ball-change certificate uses."""

    delta1: str  # "zeta" (Lemma 1) or "naive" (eq. 9's coefficient)
    m: str  # "fine" (exact ||M_l||) or "coarse" (xi_l)
    c: Union[float, str]  # the softmax constant, or "refined" (c_l(eps) per head)

    @property
    def needs_m(self) -> bool:
        """Whether it uses the exact ||M_l|| (a power iteration, with a certified upper estimate)."""
        return self.m == "fine"

    @property
    def estimates(self) -> str:
        """Which certified estimates a certificate rests on: "" (deterministic), "zeta", or "zeta+m"."""
        if self.delta1 == "naive" and not self.needs_m:
            return ""
        return "zeta+m" if self.needs_m else "zeta"

    def delta(self, eps: Tensor, *, zeta: Tensor, naive1: Tensor, m_fine: Optional[Tensor], xi: Tensor, b: Tensor,
              xvo: Tensor, vo: Tensor, dh: int, rows: Optional[lofast_refined.RowTerms] = None) -> Tensor:
        """Theorem 1 with this variant's ingredients: (...,). zeta, naive1: (...,); m_fine, xi, xvo: (..., h);
        b, vo: (h,); rows: the per-row terms (needed for c = "refined")."""
        if self.needs_m and m_fine is None:
            raise ValueError("this bound needs the exact ||M_l||: compute the terms with fine=True")
        m = m_fine if self.needs_m else xi
        if self.c == "refined":
            if rows is None:
                raise ValueError("the refined bound needs the per-row softmax terms: compute them with fine=True")
            c = lofast_refined.change_constant(rows, eps, m, b)
        else:
            c = float(self.c)
        d1 = naive1 if self.delta1 == "naive" else zeta
        return lofast.theorem1(d1, m, b, xvo, vo, dh, eps, c)

    def at_state(self, s, eps) -> Tensor:
        """delta(X, eps) of the registry's layer map (no residual) at an InputState s: (...,). In certifying mode
        (s.certify) from the certified upper estimates of zeta and ||M_l||, padded by s.rounding_allowance."""
        e = torch.as_tensor(eps, dtype=s.X.dtype, device=s.X.device)
        rows = s.row_terms if self.c == "refined" else None
        return self.delta(e, zeta=s.zeta_cert if self.delta1 == "zeta" else None,
                          naive1=(s.VO_norm * s.P_norm).sum(-1) if self.delta1 == "naive" else None,
                          m_fine=s.m_cert if self.needs_m else None, xi=s.m_coarse, b=s.w.B_norm(),
                          xvo=s.value_norm_centered if self.c == "refined" else s.value_norm, vo=s.VO_norm,
                          dh=s.w.dh, rows=rows) * s.rounding_allowance


# name -> (variant, label, paper); declared in this order by harness.bounds.registry (the certificates' table order)
VARIANTS = {
    "naive": (Theorem1Variant("naive", "coarse", 1.0), "eq. 9 naive (paper)",
              "LoFAST (Havens et al.) eq. 9 + coarse Delta_2 (eq. 23)"),
    "coarse": (Theorem1Variant("zeta", "coarse", 1.0), "Thm 1, xi (paper)", "LoFAST (Havens et al.) Thm 1 with xi_l"),
    "fine": (Theorem1Variant("zeta", "fine", 1.0), "Thm 1, exact ||M|| (ours)",
             "LoFAST (Havens et al.) Thm 1 with the exact ||M_l||"),
    "sharp": (Theorem1Variant("zeta", "fine", 0.5), "exact ||M||, softmax 1/2 (ours)",
              "LoFAST Thm 1 with the exact ||M_l|| and JaSMin Cor. 1's c = 1/2"),
    "refined": (Theorem1Variant("zeta", "fine", "refined"), "exact ||M||, per-ball softmax c(eps) (ours)",
                "LoFAST Thm 1 with the exact ||M_l|| and the per-ball softmax constant (docs/math.md §1)"),
}
