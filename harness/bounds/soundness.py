"""THE soundness rule every consumer of the bound registry applies (re-exported as registry.is_sound)."""
from __future__ import annotations

import math

from harness.settings import SOUND_RTOL  # beyond the truth's relative accuracy in every dtype


def is_sound(kind: str, value: float, reference: float, guaranteed: bool = True) -> bool:
    """THE soundness rule: False only for a guaranteed upper bound below its reference (the truth for a local or
    ball bound, PGD at the same eps for a ball-change bound), or a lower bound above it, by more than SOUND_RTOL
    relative to the reference. A guaranteed bound that is not a finite number (NaN, or an infinity that
    promises nothing) is unsound: a bound not proven at an input is declared not guaranteed instead."""
    if not guaranteed or kind not in ("upper", "lower"):
        return True
    if not math.isfinite(value):
        return False
    tol = SOUND_RTOL * abs(reference)
    return not (value < reference - tol) if kind == "upper" else not (value > reference + tol)
