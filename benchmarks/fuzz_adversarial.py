"""Certificates against adversarial layer families (tests/test_adversarial_starts.py is its bounded version): layers
built by someone who read the code, in float64 and float32, through the registry in certifying mode
(InputState(certify=...)), every ball-change certificate against the true change over the eps-ball.

Families (each layer with 1-4 inputs, eps from 1e-8 to 1e2):
- `public_start` / `draft_start`: one head, wq = 0 (uniform attention: the layer is the linear map E -> P E VO,
  whose change over the ball is eps sigma_1(VO) exactly), wo = I, VO = U diag(s1, 1, 1, 0.99, ...) V^T with its top
  left singular vector orthogonal to the column mean of the start Lanczos would have used: the fixed public start
  of earlier versions (randn, seed 0), or the hashed start the current code draws for a draft of the same model;
- `near_degenerate`: wq = 0, VO's singular values 1 - k 1e-5 (clustered top), float32;
- `one_hot`: query / key weights x10 to x100 (every row near one-hot), biases in half of the layers;
- `huge_row`: one token scaled by 1e3 to 1e6;
- `exhausted`: n d <= 32, where the Krylov space is the whole space.
For the linear families the true change is exact; for the others the largest of PGD on the change (kernels.pgd),
the change where the smallest score margins are pushed down (margin_attack) and the change along the dense
Jacobian's top right singular vector, computed in float64 on the layer that was
certified (in float32: the rounded weights and inputs, which near one-hot are another layer than the float64 one:
scores x1e4 move by 1e-3 when the weights round). A certificate below it (float64: by more than 1e-9 relative plus
16 units of roundoff of ||F||; float32: at all, its rounding allowance being inside the certificate) is a
violation. Prints one JSON line: checks and violations per family
and dtype, and the ratios best / the strongest attack (median, max) per family at eps 1e-8, 1e-4, 1e-3 and 1e-1.

    python -m benchmarks.fuzz_adversarial --layers 2000 --seed 0
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from harness.bounds import registry
from harness.bounds.input_state import InputState
from harness.kernels import layer
from harness.kernels.attention import AttentionWeights, attention_unchecked, scores
from harness.kernels.pgd import pgd_maximize
from harness.kernels.power import dense_jacobian

D64 = torch.float64
ROUNDOFF = 16 * torch.finfo(D64).eps
EPS = (1e-8, 1e-5, 1e-4, 1e-3, 1e-1, 1.0, 100.0)
FAMILIES = ("public_start", "draft_start", "near_degenerate", "one_hot", "huge_row", "exhausted")
CERTIFY = dict(steps=64, fail_prob=1e-9)


def _vo_against(m: torch.Tensor, s: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """VO = U diag(s) V^T with U's first column orthogonal to the row vector m."""
    d = m.shape[0]
    A = torch.randn(d, d, dtype=D64, generator=g)
    A[:, 0] = m
    Q, _ = torch.linalg.qr(A)
    U = torch.cat([Q[:, 1:2], Q[:, :1], Q[:, 2:]], 1)
    V, _ = torch.linalg.qr(torch.randn(d, d, dtype=D64, generator=g))
    return U @ torch.diag(s) @ V.T


def _uniform(VO: torch.Tensor, g: torch.Generator) -> AttentionWeights:
    d = VO.shape[0]
    return AttentionWeights(torch.zeros(1, d, d, dtype=D64), torch.randn(1, d, d, dtype=D64, generator=g),
                            VO[None].clone(), torch.eye(d, dtype=D64)[None])


def _spectrum(d: int, s1: float) -> torch.Tensor:
    return torch.tensor([s1, 1.0, 1.0] + [max(0.99 - 0.01 * i, 0.05) for i in range(d - 3)], dtype=D64)


def make(family: str, g: torch.Generator):
    """(w, X, linear): one layer of the family in float64, its inputs, and whether the map is linear (then the
    true change over the ball is eps ||VO||)."""
    pick = lambda xs: xs[int(torch.randint(0, len(xs), (1,), generator=g))]  # noqa: E731
    if family in ("public_start", "draft_start"):
        n, d, s1 = pick((4, 8, 16, 32)), pick((8, 16, 32)), pick((2.0, 3.0, 5.0))
        X = torch.randn(1, n, d, dtype=D64, generator=g)
        start = torch.randn(1, n, d, dtype=D64, generator=torch.Generator().manual_seed(0))[0]
        if family == "draft_start":
            draft = _uniform(_vo_against(start.mean(0), _spectrum(d, s1), g), g)
            start = layer.truth_start(X, draft, 0, False)[0].reshape(n, d)
        return _uniform(_vo_against(start.mean(0), _spectrum(d, s1), g), g), X, True
    if family == "near_degenerate":
        n, d = 24, 32
        s = 1 - 1e-5 * torch.arange(d, dtype=D64)
        V, _ = torch.linalg.qr(torch.randn(d, d, dtype=D64, generator=g))
        U, _ = torch.linalg.qr(torch.randn(d, d, dtype=D64, generator=g))
        return _uniform(U @ torch.diag(s) @ V.T, g), torch.randn(1, n, d, dtype=D64, generator=g), True
    if family == "one_hot":
        d, h = pick((8, 16)), pick((1, 2))
        w = AttentionWeights.random(d=d, h=h, generator=g, bias=bool(torch.rand(1, generator=g) < 0.5))
        k = pick((10.0, 30.0, 100.0))
        w = AttentionWeights(w.wq * k, w.wk * k, w.wv, w.wo, w.bq, w.bk, w.bv, w.bo)
        return w, torch.randn(2, pick((4, 8)), d, dtype=D64, generator=g), False
    if family == "huge_row":
        d = pick((8, 16))
        w = AttentionWeights.random(d=d, h=2, generator=g)
        X = torch.randn(2, 6, d, dtype=D64, generator=g)
        X[:, 0] *= pick((1e3, 1e6))
        return w, X, False
    if family == "exhausted":
        n, d = pick(((2, 4), (4, 4), (2, 8), (4, 8))), None
        n, d = n
        w = AttentionWeights.random(d=d, h=pick((1, 2)), scale=pick((0.5, 2.0, 8.0)), generator=g)
        return w, torch.randn(2, n, d, dtype=D64, generator=g), False
    raise ValueError(f"unknown family {family!r}")


def true_change(w: AttentionWeights, X: torch.Tensor, eps: float, linear: bool, g: torch.Generator):
    """(reference change over the ball, per input (B,), float64; the attack alone, for the tightness ratios)."""
    F = lambda Z: attention_unchecked(Z, w, residual=False)  # noqa: E731
    if linear:
        c = torch.full((X.shape[0],), eps * float(torch.linalg.matrix_norm(w.wv[0] @ w.wo[0], 2)), dtype=D64)
        return c, c
    obj = lambda U: (F(X + U) - F(X)).flatten(-2).norm(dim=-1)  # noqa: E731
    attack = pgd_maximize(obj, torch.zeros_like(X), eps, steps=40, restarts=3, batch_dims=1).value
    attack = torch.maximum(attack, margin_attack(F, w, X, eps))
    along = []
    for b in range(X.shape[0]):
        v = torch.linalg.svd(dense_jacobian(F, X[b])).Vh[0].reshape(X[b].shape)
        along.append(max(float((F(X[b] + sg * eps * v) - F(X[b])).norm()) for sg in (1.0, -1.0)))
    return torch.maximum(attack, torch.tensor(along, dtype=D64)), attack


def margin_attack(F, w: AttentionWeights, X: torch.Tensor, eps: float, rows: int = 4) -> torch.Tensor:
    """The change at the points that push the smallest margins s_ik* - s_ij down the most (B,): near one-hot rows
    have a vanishing softmax gradient, so PGD on the change alone does not find the point where a row tips over."""
    S = scores(X, w)
    n = S.shape[-1]
    top = S.argmax(-1, keepdim=True)
    margin = (S.gather(-1, top) - S).masked_fill(torch.nn.functional.one_hot(top[..., 0], n).bool(), math.inf)
    best = torch.zeros(X.shape[0], dtype=X.dtype)
    for b in range(X.shape[0]):
        for f in margin[b].flatten().argsort()[:rows].tolist():
            l, i, j = f // (n * n), (f // n) % n, f % n
            k = int(top[b, l, i, 0])
            push = lambda U: (lambda S: S[0, l, i, j] - S[0, l, i, k])(scores(X[b:b + 1] + U, w)).reshape(1)  # noqa
            U = pgd_maximize(push, torch.zeros_like(X[b:b + 1]), eps, steps=30, restarts=1, batch_dims=1).delta
            for t in (0.5, 1.0):
                best[b] = max(float(best[b]), float((F(X[b:b + 1] + t * U) - F(X[b:b + 1])).norm()))
    return best


def run(layers: int, seed: int = 0, families=FAMILIES) -> dict:
    g = torch.Generator().manual_seed(seed)
    names = registry.ball_change_names()
    out = dict(layers=layers, seed=seed, checks={}, violations={}, worst={}, best_over_attack={})
    ratios = {}
    t0 = time.perf_counter()
    for i in range(layers):
        fam = families[i % len(families)]
        w, X, linear = make(fam, g)
        dtypes = (torch.float64, torch.float32) if fam != "near_degenerate" else (torch.float32,)
        for dt in dtypes:
            key = f"{fam}/{str(dt).replace('torch.', '')}"
            Xd, wd = X.to(dt), w.to(dtype=dt)
            s = InputState(Xd, wd, certify=CERTIFY)
            Xr, wr = Xd.to(D64), wd.to(dtype=D64)  # the certified layer, exactly, in float64
            F64 = lambda Z: attention_unchecked(Z, wr, residual=False)  # noqa: E731
            for eps in EPS:
                ref, _ = true_change(wr, Xr, eps, linear, g)
                fl = ROUNDOFF * (F64(Xr).flatten(-2).norm(dim=-1) + ref) if dt == D64 else 0.0
                e = torch.full((X.shape[0],), eps, dtype=dt)
                for name in names:
                    cert = registry.get(name, "layer").fn(s, e).to(D64)
                    ok = cert + fl >= ref * (1 - 1e-9) if dt == D64 else cert >= ref
                    out["checks"][key] = out["checks"].get(key, 0) + int(ok.numel())
                    out["violations"][key] = out["violations"].get(key, 0) + int((~ok).sum())
                    r = float((cert / ref.clamp_min(1e-300)).min())
                    if r < out["worst"].get(key, (math.inf,))[0]:
                        out["worst"][key] = (r, name, eps)
                    if name == "best" and dt == D64 and eps in (1e-8, 1e-4, 1e-3, 1e-1):
                        ratios.setdefault(f"{fam}@{eps:g}", []).extend((cert / ref).tolist())
    for k, v in sorted(ratios.items()):
        out["best_over_attack"][k] = dict(median=round(statistics.median(v), 4), max=round(max(v), 4), n=len(v))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--families", default=",".join(FAMILIES))
    a = p.parse_args(argv)
    res = run(a.layers, a.seed, tuple(a.families.split(",")))
    print(json.dumps(res))
    return 1 if any(res["violations"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
