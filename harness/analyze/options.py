"""AnalyzeOptions: how `analyze` computes (dtype, device, the eps-ball radius, PGD, the truths' Lanczos settings),
one frozen object validated once on construction and handed to every stage (core.analyze, the input states, the
position-term path) instead of ten loose keyword arguments. What `analyze` reads (model, inputs, layers, methods,
plug-ins, token budget) stays in its own arguments.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from harness.analyze import validate
from harness.settings import (ANALYZE_EPS, ANALYZE_PGD_STEPS, CERTIFY_STEPS, ITERS, REPORT_FAIL_PROB, dtype_name,
                              torch_dtype)

if TYPE_CHECKING:  # torch_dtype loads it: the CLI's parser and checks answer without it
    import torch

ANALYZE_DTYPES = ("float64", "float32")  # the kernels' compute dtypes (harness.settings.COMPUTE_DTYPES) by name


@dataclass(frozen=True)
class AnalyzeOptions:
    """dtype / device: where the bounds are computed (the forward pass runs in the model's own weights). eps: the
    radius of the certificates' eps-ball rows and of PGD (0 skips them). pgd_steps / pgd_restarts: PGD's budget (0
    steps skips it). fail_prob: failure probability of each certified upper estimate of a truth (truth_upper).
    tol / iters: Lanczos tolerance (None: harness.settings.truth_tol of the dtype) and product cap of the truths.
    certify_steps: Lanczos products before a truth may stop (a longer first Krylov cycle tightens truth_upper).
    seed: of every random start (the truths' Gaussian, PGD). mixed (float64 only): the truths iterate in float32
    and are refined in float64 (harness.kernels.mixed; the reported values keep their float64
    meaning); False: float64 throughout. A bad value is a validate.UsageError (ValueError)."""

    dtype: str = "float64"
    device: str = "cpu"
    eps: float = ANALYZE_EPS
    pgd_steps: int = ANALYZE_PGD_STEPS
    pgd_restarts: int = 1
    fail_prob: float = REPORT_FAIL_PROB
    tol: Optional[float] = None
    iters: int = ITERS
    certify_steps: int = CERTIFY_STEPS
    seed: int = 0
    mixed: bool = True

    def __post_init__(self):
        try:
            dt = torch_dtype(self.dtype, ANALYZE_DTYPES)
        except ValueError as e:
            raise validate.UsageError("--dtype", str(e), "pass --dtype float64 (the default) or float32") from None
        object.__setattr__(self, "dtype", dtype_name(dt))
        if not isinstance(self.mixed, bool):
            raise validate.UsageError("mixed", f"got {self.mixed!r}", "pass True or False")
        validate.check_numbers(self.eps, self.pgd_steps)
        checks = (("pgd_restarts", self.pgd_restarts >= 1, "at least one PGD start"),
                  ("fail_prob", 0 < self.fail_prob < 1, "a probability in (0, 1)"),
                  ("tol", self.tol is None or 0 < self.tol < 1, "a relative tolerance in (0, 1), or None"),
                  ("iters", self.iters >= 1, "at least one product"),
                  ("certify_steps", self.certify_steps >= 1, "at least one product"))
        for name, ok, want in checks:
            if not ok:
                raise validate.UsageError(name, f"got {getattr(self, name)!r}", f"pass {want}")

    @classmethod
    def make(cls, options: Optional["AnalyzeOptions"] = None, **overrides) -> "AnalyzeOptions":
        """`options` (default AnalyzeOptions()) with the fields in `overrides` replaced; an unknown name is a
        TypeError naming the fields."""
        base = options if options is not None else cls()
        if not isinstance(base, cls):
            raise TypeError(f"options must be an AnalyzeOptions, got {type(base).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise TypeError(f"analyze() got unexpected keyword arguments {bad}; options: {', '.join(sorted(known))}")
        return dataclasses.replace(base, **overrides) if overrides else base

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    def state_kw(self) -> dict:
        """The truths' settings, as AnalyzeState's keyword arguments."""
        return dict(tol=self.tol, iters=self.iters, fail_prob=self.fail_prob, seed=self.seed,
                    certify_steps=self.certify_steps, mixed=self.mixed)
