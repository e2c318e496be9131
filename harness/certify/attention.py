"""The attention block of a whole-model certificate: the bound registry's ball-change certificates (biases and
causal masks included) at the block's nominal input, in certifying mode (docs/math.md §1, §4, §6).

`Attention` is the map F(X) (the model's self-attention with its output projection), or with `residual=True`
X + F(X) (registry.ball_changes(residual=True): every certificate plus r, and the second-order certificate of the
residual map itself from the certified ||I + J_F(X)||). The minimum over the certificates is the block's change;
its name is reported.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch

from harness.bounds import registry, second_order
from harness.bounds.input_state import InputState
from harness.certify.block import Block, Rows
from harness.kernels.attention import AttentionWeights, attention
from harness.settings import FAIL_PROB

Tensor = torch.Tensor


class Attention(Block):
    """Self-attention F(X) (or X + F(X) with residual) with weights w; `names`: the registry certificates tried
    (default: every registered ball-change certificate, plug-ins included)."""

    def __init__(self, w: AttentionWeights, causal: bool = False, residual: bool = False,
                 names: Optional[Iterable[str]] = None, fail_prob: Optional[float] = None, name: str = "attention"):
        self.w, self.causal, self.residual, self.name = w, bool(causal), bool(residual), name
        self.names = list(names) if names is not None else [n for n in registry.ball_change_names() if n != "best"]
        registry.check_ball_change_names(self.names)
        self.fail_prob = FAIL_PROB if fail_prob is None else float(fail_prob)

    @property
    def estimates(self) -> int:
        """How many certified Lanczos estimates one input's certificate rests on (zeta, each head's ||M_l||, the
        layer's ||J||, and ||I + J|| with the residual): the union bound's count."""
        return 2 + self.w.h + int(self.residual)

    def forward(self, X: Tensor) -> Tensor:
        Y = attention(X, self.w, causal=self.causal)  # float64 weights and inputs, as programs build them
        return X + Y if self.residual else Y

    def prepare(self, X: Tensor) -> InputState:
        return InputState(X, self.w, self.causal, certify=dict(fail_prob=self.fail_prob))

    def change(self, s: InputState, r: float, rows: Rows):
        vals = {k: float(v) for k, v in registry.ball_changes(s, r, self.names, residual=self.residual).items()}
        how = min(vals, key=vals.get)
        return vals[how], None, how

    def jacobian(self, s: InputState, r: float, rows: Rows):
        """J0 = the certified ||J_F(X)|| (||I + J_F(X)|| with the residual, or 1 + ||J_F(X)||); D = r K(r), K the
        second-order certificate's curvature bound over the ball (the bilinear second derivative is bounded by the
        quadratic one by polarization)."""
        K = float(second_order.curvature(s.curvature, torch.as_tensor(r, dtype=s.X.dtype))) * s.rounding_allowance
        s.truth_layer  # noqa: B018 - fills s.upper["layer"]
        J0 = float(s.upper["layer"]) * s.rounding_allowance
        if self.residual:
            s.truth_residual  # noqa: B018 - fills s.upper["residual"]
            J0 = min(1.0 + J0, float(s.upper["residual"]) * s.rounding_allowance)
        return J0, r * K