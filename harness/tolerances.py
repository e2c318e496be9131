"""Every numerical tolerance of the toolkit, once per dtype and per purpose, with the reason for its value.

Three purposes, three functions:

- `norm_tol(dtype)`: the relative Ritz residual at which the power / Lanczos iterations *inside bounds* stop
  (zeta, ||M_l||, ||P_l|| caps; kernels.power's default). A bound is as tight as the norms it reads, so these are
  run close to the dtype's rounding: 1e-10 in float64 (a few products more than 1e-8) and 1e-5 in float32 and
  below (float32 rounding is 6e-8; sums over n x n softmax maps accumulate more).
- `truth_tol(dtype)`: the tolerance of "the truth", the true local Lipschitz constant ||J(X)|| of a head, a layer
  or a block, wherever it is computed (bound registry, `attnlip analyze`, the Castin experiments). The Lanczos
  residual test ||J^T J y - theta y|| / theta < tol bounds the relative error of sigma^2 by tol (Weyl), so of
  sigma by tol / 2. float64: 1e-6 (sigma to <= 5e-7 relative, far below every reported ratio's 3 digits; each
  further decade costs a few more products). float32: 1e-5. Measured on layers 0, 5 and 11 of a random
  BERT-base at n = 256: float32 Lanczos converged at 1e-4 / 1e-5 / 1e-6 in 20-28 / 24-30 / 30-34 products
  (float64 at 1e-10: 42-49), within 8e-8 of float64 every time, so 1e-5 costs 2-4 products more than 1e-4 and
  keeps the truth's error (<= 5e-6 on sigma) inside the soundness slack below.
- `SOUND_RTOL`: the slack of the one soundness rule (bounds.registry.is_sound): an upper bound counts as below
  the truth (a lower bound above its reference) only by more than SOUND_RTOL relative. It must exceed the
  truth's own error in every dtype: 1e-5 > truth_tol(float32) / 2 = 5e-6 > truth_tol(float64) / 2.

Level 0: pure Python plus torch dtypes; every layer may import it.
"""
from __future__ import annotations

import torch

NORM_TOL = {torch.float64: 1e-10}  # float32 and lower: NORM_TOL_LOW
NORM_TOL_LOW = 1e-5
TRUTH_TOL = {torch.float64: 1e-6}  # float32 and lower: TRUTH_TOL_LOW
TRUTH_TOL_LOW = 1e-5
SOUND_RTOL = 1e-5


def norm_tol(dtype) -> float:
    """Lanczos / power tolerance for the norms bounds are built from: 1e-10 in float64, 1e-5 below."""
    return NORM_TOL.get(dtype, NORM_TOL_LOW)


def truth_tol(dtype) -> float:
    """Lanczos tolerance of the true local Lipschitz constant: 1e-6 in float64, 1e-5 below."""
    return TRUTH_TOL.get(dtype, TRUTH_TOL_LOW)
