"""JaSMin (Yudin et al.) Appendix C: the sharper local bound whose order in the sequence length is sqrt(N).

Theorem 3 bounds the attention-score block of the Jacobian by ||X||^2 max_i ||J_sm(P_i)||; App. C instead bounds
the block-diagonal factor blockdiag_i(X^T J_sm(P_i)) by its largest block, giving per head l
    ||J_{f_l}(X)|| <= ||VO_l|| ( ||P_l|| + 2 max_i ||X^T J_sm(P_l,i)|| ||X|| ||A_l|| ),
which is <= Theorem 3 (||X^T J_sm|| <= ||X|| ||J_sm||) and, with ||x_i|| <= R, at most
||VO_l|| sqrt(N) (1 + 2 R^2 ||A_l||) (the paper's O(sqrt(N)) form). J_sm(p) X = diag(p) (X - 1 m^T), m = X^T p, so
||X^T J_sm(P_i)|| is the spectral norm of an n x d matrix with rows p_j (x_j - m_i). Biases: Remark 2 (evaluated
for w.augmented() on [X, 1], as harness.bounds.jasmin). Causal: masked entries have p = 0 and drop out.
Plug-in form: `jasmin_appc(X, w, causal)` -> (..., h) (registry.register_bound; bound_leaderboard's `plugins` key).
"""
from __future__ import annotations

import torch

from harness.kernels.attention import AttentionWeights, augment_input, check_pair, probs

Tensor = torch.Tensor


def jasmin_appc(X: Tensor, w: AttentionWeights, causal: bool = False, chunk: int = 16) -> Tensor:
    """JaSMin App. C per-head upper bound on ||J_{f_l}(X)||: (..., n, d) -> (..., h)."""
    check_pair(X, w)
    if w.has_bias:
        X, w = augment_input(X), w.augmented()
    P = probs(X, w, causal)  # (..., h, n, n)
    Xh = X.unsqueeze(-3)  # (..., 1, n, d)
    n = X.shape[-2]
    worst = torch.zeros(P.shape[:-2], dtype=X.dtype, device=X.device)  # (..., h)
    for s in range(0, n, chunk):
        p = P[..., s:s + chunk, :]  # (..., h, c, n): rows i of this chunk
        m = p @ Xh  # (..., h, c, d): m_i = X^T p_i
        D = p.unsqueeze(-1) * (Xh.unsqueeze(-3) - m.unsqueeze(-2))  # (..., h, c, n, d): diag(p_i)(X - 1 m_i^T)
        worst = torch.maximum(worst, torch.linalg.matrix_norm(D, ord=2).amax(-1))
    pn = torch.linalg.matrix_norm(P, ord=2)  # (..., h)
    xn = torch.linalg.matrix_norm(X, ord=2).unsqueeze(-1)  # (..., 1)
    return w.VO_norm() * (pn + 2 * worst * xn * w.A_norm())
