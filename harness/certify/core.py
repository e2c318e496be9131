"""Certify one input of a Program: the certified l2 radius, the smallest adversarial radius an attack finds, and
which certificate each block used (docs/math.md §6).

`certified(eps)` holds when every margin z_y - z_j survives the logit change the chain's propagated radius allows
(block.margins_certified) or, where the network route applies, the second-order margin bound of
harness.certify.network; the radius is the largest such eps, by bisection in log space (each certificate grows with
eps, so `certified` is monotone). The attack runs projected gradient ascent on max_{j != y} z_j - z_y over the
same perturbation set (the rows that may move), for growing radii then bisection: the smallest radius at which it
changes the prediction is an upper bound on the true robust radius, so certified <= attack always (a soundness
check reported per input).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from harness.certify.block import Rows, margins_certified
from harness.certify.network import ball_series, network_certified
from harness.certify.programs import Program
from harness.kernels.pgd import pgd_maximize
from harness.models.certify import margins

Tensor = torch.Tensor
REL_TOL = 1e-3  # the radius bisection stops when hi / lo < 1 + REL_TOL


@dataclass
class InputCertificate:
    label: int
    pred: int
    margin: float
    radius: float  # certified: every input within it is classified as `label` (0 when misclassified)
    route: str  # "layer by layer" or "network" (second order), the one that certified the radius
    blocks: List[tuple] = field(default_factory=list)  # (block, certificate, radius after it) at the radius
    seconds: float = 0.0
    fail_prob: float = 0.0  # the certificate holds with probability >= 1 - fail_prob (Lanczos starts)
    attack_radius: float = math.nan  # smallest radius where the attack changed the prediction (inf: never)
    attack_seconds: float = 0.0

    @property
    def correct(self) -> bool:
        return self.pred == self.label

    @property
    def sound(self) -> bool:
        return not (self.radius > self.attack_radius)


def _certified(program: Program, trace, logits: Tensor, y: int, eps: float, rows: Rows, network, norms):
    """(the route that certifies eps, or None; the balls of every step at eps)."""
    series = ball_series(trace, eps, rows, norms)
    if margins_certified(logits, y, program.W, series[-1].radii[-1]):
        return "layer by layer", series
    if network is not None and network_certified(network, trace, eps, rows, norms, series):
        return "network", series
    return None, series


def certify_input(program: Program, X: Tensor, y: int, rows: Rows = None, network: bool = True,
                  rel_tol: float = REL_TOL) -> InputCertificate:
    """Certify the prediction at the perturbed input X (n, d_in), label y; rows: which rows may move (None: all)."""
    from harness.certify.network import prepare_network
    from harness.certify.tangents import prefix_norms

    t0 = time.perf_counter()
    X = X.detach().to(torch.float64)
    trace = program.chain.trace(X)
    logits = (trace.output @ program.W + program.b)[0]
    pred = int(logits.argmax())
    margin = float(margins(logits[None], torch.tensor([int(y)]))[0])
    out = InputCertificate(int(y), pred, margin, 0.0, "", fail_prob=program.fail_prob)
    if pred != y:
        out.seconds = time.perf_counter() - t0
        return out
    net = prepare_network(program, trace, X, y) if network else None
    norms = prefix_norms(trace, rows) if network else None
    scale = float(torch.linalg.vector_norm(X if rows is None else X[list(rows)])) or 1.0
    lo, hi = 0.0, scale * 1e-3
    while _certified(program, trace, logits, y, hi, rows, net, norms)[0] and hi < scale * 1e6:
        lo, hi = hi, hi * 4.0
    if lo == 0.0:  # shrink until something is certified (or the margin is within rounding)
        while hi > scale * 1e-12 and not _certified(program, trace, logits, y, hi / 4.0, rows, net, norms)[0]:
            hi /= 4.0
        lo = hi / 4.0 if hi > scale * 1e-12 else 0.0
    while lo > 0 and hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if _certified(program, trace, logits, y, mid, rows, net, norms)[0] else (lo, mid)
    out.radius = lo
    if lo > 0:
        route, series = _certified(program, trace, logits, y, lo, rows, net, norms)
        out.route, b = route or "", series[-1]
        out.blocks = [(s.block.name, how, r) for s, how, r in zip(trace.steps, b.how, b.radii[1:])]
    out.seconds = time.perf_counter() - t0
    return out


def margin_objective(program: Program, X: Tensor, y: int, idx: List[int]):
    """V (k, len(idx), d) -> max_{j != y} z_j - z_y (k,) with rows idx of X replaced by V: >= 0 where the
    prediction y is broken."""
    def objective(V: Tensor) -> Tensor:
        full = X.expand(V.shape[0], *X.shape).clone()
        full[:, idx] = V
        z = program.forward(full)
        return -margins(z, torch.full(z.shape[:1], int(y)))

    return objective


def attack_radius(program: Program, X: Tensor, y: int, rows: Rows = None, start: float = 1e-3,
                  steps: int = 30, restarts: int = 3, bisections: int = 8, seed: int = 0,
                  limit: Optional[float] = None) -> float:
    """The smallest l2 radius at which projected gradient ascent changes the prediction (inf if none up to
    `limit`, default 100 ||X[rows]||): an upper bound on the robust radius."""
    X = X.detach().to(torch.float64)
    idx = list(range(X.shape[0])) if rows is None else list(rows)
    base = X[idx]
    objective = margin_objective(program, X, y, idx)

    def broken(eps: float) -> bool:
        res = pgd_maximize(objective, base[None], torch.tensor([eps], dtype=X.dtype), steps=steps,
                           restarts=restarts, batch_dims=1, seed=seed)
        return bool(res.value[0] >= 0)

    scale = float(torch.linalg.vector_norm(base)) or 1.0
    limit = 100.0 * scale if limit is None else limit
    eps = max(start, scale * 1e-6)
    lo = 0.0
    while not broken(eps):
        lo, eps = eps, eps * 2.0
        if eps > limit:
            return math.inf
    hi = eps
    for _ in range(bisections):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if broken(mid) else (mid, hi)
    return hi


def attack_into(cert: InputCertificate, program: Program, X: Tensor, rows: Rows = None, **kw) -> None:
    """Fill cert.attack_radius / attack_seconds (started at the certified radius, where nothing can break)."""
    t0 = time.perf_counter()
    if cert.correct:
        cert.attack_radius = attack_radius(program, X, cert.label, rows, start=max(cert.radius, 1e-6), **kw)
    else:
        cert.attack_radius = 0.0
    cert.attack_seconds = time.perf_counter() - t0


def summary_row(cert: InputCertificate) -> Dict[str, object]:
    return dict(label=cert.label, pred=cert.pred, correct=cert.correct, margin=cert.margin,
                certified_radius=cert.radius, route=cert.route, attack_radius=cert.attack_radius,
                gap=cert.attack_radius / cert.radius if cert.radius > 0 else math.inf, sound=cert.sound,
                seconds=cert.seconds, attack_seconds=cert.attack_seconds, fail_prob=cert.fail_prob)
