"""Adversarial accuracy of an image classifier: FGSM, PGD (l_inf, l2) and AutoAttack (JaSMin §5, Tables 1-4).

Backend: the maintained `torchattacks` library (3.5.x; it imports beside torch 2.13 when installed with
`pip install --no-deps torchattacks`, since its only heavy requirement, torchvision, is never imported) when
it is importable, else the small built-in implementations below (same algorithms: FGSM = one signed-gradient
step; PGD = Madry et al. with a random start, `steps` steps of size `alpha`, projection onto the ball and onto
the image box [0, 1]). AutoAttack exists only through torchattacks: `autoattack_accuracy` raises
ImportError naming the package when it is missing.

The model maps images (B, C, H, W) in [0, 1] to logits (B, classes); normalization belongs inside it.
Every function evaluates the model in eval mode and restores its previous mode.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

NORMS = ("linf", "l2")


def torchattacks_available() -> bool:
    """True when the torchattacks package imports here."""
    try:
        import torchattacks  # noqa: F401
    except Exception:  # pragma: no cover - depends on the environment
        return False
    return True


def backend_name(backend: str = "auto") -> str:
    """Resolve "auto" to "torchattacks" when importable, else "builtin"; validate explicit names."""
    if backend not in ("auto", "torchattacks", "builtin"):
        raise ValueError(f"backend must be 'auto', 'torchattacks' or 'builtin', got {backend!r}")
    if backend == "auto":
        return "torchattacks" if torchattacks_available() else "builtin"
    if backend == "torchattacks" and not torchattacks_available():
        raise ImportError("backend='torchattacks' but the package is not installed: "
                          "`pip install --no-deps torchattacks` (it needs no torchvision at import)")
    return backend


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """Temporarily put `model` in eval mode."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)


def _check(x: Tensor, y: Tensor, eps: float, norm: str) -> None:
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if x.dim() != 4:
        raise ValueError(f"images must have shape (B, C, H, W), got {tuple(x.shape)}")
    if y.shape != x.shape[:1]:
        raise ValueError(f"labels must have shape (B,) = {tuple(x.shape[:1])}, got {tuple(y.shape)}")
    if float(x.min()) < 0 or float(x.max()) > 1:
        raise ValueError("images must lie in [0, 1] (put normalization inside the model)")


def _flat_norm(t: Tensor) -> Tensor:
    return t.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (t.dim() - 1)))  # (B, 1, 1, 1)


def _project(delta: Tensor, eps: float, norm: str) -> Tensor:
    """Projection onto the eps-ball of the norm, per sample."""
    if norm == "linf":
        return delta.clamp(-eps, eps)
    n = _flat_norm(delta)
    return delta * torch.clamp(eps / n, max=1.0)


def _ascent(grad: Tensor, norm: str) -> Tensor:
    """Steepest-ascent direction of unit norm: sign(g) (l_inf) or g/||g|| (l2)."""
    return grad.sign() if norm == "linf" else grad / _flat_norm(grad)


def _loss_grad(model, x: Tensor, y: Tensor) -> Tensor:
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = F.cross_entropy(model(x), y, reduction="sum")
        (g,) = torch.autograd.grad(loss, x)
    return g


def fgsm_builtin(model, x: Tensor, y: Tensor, eps: float, norm: str = "linf") -> Tensor:
    """FGSM (Goodfellow et al. 2015): x + eps * ascent(grad CE), clipped to [0, 1]."""
    g = _loss_grad(model, x, y)
    return (x + eps * _ascent(g, norm)).clamp(0, 1).detach()


def pgd_builtin(model, x: Tensor, y: Tensor, eps: float, steps: int = 10, alpha: Optional[float] = None,
                norm: str = "linf", random_start: bool = True, seed: int = 0) -> Tensor:
    """PGD (Madry et al. 2018) on the CE loss within the eps-ball and the box [0, 1]."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    alpha = 2.5 * eps / steps if alpha is None else alpha
    gen = torch.Generator(device=x.device).manual_seed(seed)
    delta = torch.zeros_like(x)
    if random_start and eps > 0:
        u = torch.rand(x.shape, generator=gen, device=x.device, dtype=x.dtype) * 2 - 1  # (B, C, H, W)
        delta = _project(u * eps, eps, norm)
    xa = (x + delta).clamp(0, 1)
    for _ in range(steps):
        g = _loss_grad(model, xa, y)
        xa = x + _project(xa + alpha * _ascent(g, norm) - x, eps, norm)
        xa = xa.clamp(0, 1).detach()
    return xa


def make_attack(model, kind: str, eps: float, norm: str = "linf", steps: int = 10, alpha: Optional[float] = None,
                backend: str = "auto", n_classes: int = 10, seed: int = 0, aa_version: str = "apgd",
                ) -> Callable[[Tensor, Tensor], Tensor]:
    """An attack x, y -> x_adv. kind: "fgsm" | "pgd" | "autoattack" (torchattacks only; APGD steps = `steps`).

    aa_version: "standard" (APGD-CE, APGD-T, FAB-T, Square with 5000 queries: hours on this CPU) or "apgd"
    (APGD-CE + APGD-T, AutoAttack's gradient part, what fits the budget here).
    """
    if aa_version not in ("standard", "apgd"):
        raise ValueError(f"aa_version must be 'standard' or 'apgd', got {aa_version!r}")
    if kind not in ("fgsm", "pgd", "autoattack"):
        raise ValueError(f"attack kind must be 'fgsm', 'pgd' or 'autoattack', got {kind!r}")
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    be = backend_name(backend)
    if kind == "autoattack":
        be = backend_name("torchattacks")
    if be == "builtin":
        if kind == "fgsm":
            return lambda x, y: fgsm_builtin(model, x, y, eps, norm)
        return lambda x, y: pgd_builtin(model, x, y, eps, steps, alpha, norm, True, seed)
    import torchattacks as ta

    tnorm = "Linf" if norm == "linf" else "L2"
    if kind == "fgsm":
        if norm == "linf":
            atk = ta.FGSM(model, eps=eps)
        else:  # torchattacks has no l2 FGSM: one PGD-l2 step of size eps from the clean point
            atk = ta.PGDL2(model, eps=eps, alpha=eps, steps=1, random_start=False)
    elif kind == "pgd":
        a = 2.5 * eps / steps if alpha is None else alpha
        atk = (ta.PGD(model, eps=eps, alpha=a, steps=steps, random_start=True) if norm == "linf"
               else ta.PGDL2(model, eps=eps, alpha=a, steps=steps, random_start=True))
    elif aa_version == "standard":
        atk = ta.AutoAttack(model, norm=tnorm, eps=eps, version="standard", n_classes=n_classes, seed=seed)
        for sub in atk._autoattack.attacks:  # APGD-CE, APGD-T: use the requested number of steps
            if hasattr(sub, "steps"):
                sub.steps = steps
    else:  # "apgd": AutoAttack's two gradient attacks only (APGD-CE then APGD-T on the survivors)
        atk = ta.MultiAttack([
            ta.APGD(model, norm=tnorm, eps=eps, steps=steps, n_restarts=1, loss="ce", seed=seed),
            ta.APGDT(model, norm=tnorm, eps=eps, steps=steps, n_restarts=1, n_classes=n_classes, seed=seed),
        ])
    if kind == "pgd":
        torch.manual_seed(seed)  # torchattacks draws its random start from the global generator
    return lambda x, y: atk(x, y)


def robust_accuracy(model, x: Tensor, y: Tensor, kind: str, eps: float, norm: str = "linf", steps: int = 10,
                    alpha: Optional[float] = None, batch_size: int = 256, backend: str = "auto",
                    n_classes: int = 10, seed: int = 0, aa_version: str = "apgd") -> float:
    """Accuracy (in [0, 1]) of `model` on adversarial examples of `kind` at budget eps (eps = 0: clean)."""
    _check(x, y, eps, norm)
    correct = 0
    with eval_mode(model):
        for s in range(0, x.shape[0], batch_size):
            xb, yb = x[s:s + batch_size], y[s:s + batch_size]
            if eps > 0:
                atk = make_attack(model, kind, eps, norm, steps, alpha, backend, n_classes, seed + s, aa_version)
                xa = atk(xb, yb).detach()
                if norm == "linf":
                    assert float((xa - xb).abs().max()) <= eps + 1e-5, "attack left the l_inf ball"
            else:
                xa = xb
            with torch.no_grad():
                correct += int((model(xa).argmax(-1) == yb).sum())
    return correct / max(x.shape[0], 1)


def clean_accuracy(model, x: Tensor, y: Tensor, batch_size: int = 512) -> float:
    """Accuracy on unperturbed inputs."""
    return robust_accuracy(model, x, y, "fgsm", 0.0, batch_size=batch_size)


def evaluate(model, x: Tensor, y: Tensor, budgets: Dict[str, list], pgd_steps: int = 10, aa_steps: int = 10,
             backend: str = "auto", n_classes: int = 10, seed: int = 0, aa_version: str = "apgd") -> Dict[str, float]:
    """Clean and attacked accuracies: budgets like {"fgsm": [2/255], "pgd": [...], "pgd_l2": [...],
    "autoattack": [...]} -> {"clean": acc, "fgsm@0.00784": acc, ...} (accuracies in %)."""
    out = {"clean": 100 * clean_accuracy(model, x, y)}
    for key, epss in budgets.items():
        kind, _, nrm = key.partition("_")
        norm = nrm or "linf"
        steps = aa_steps if kind == "autoattack" else pgd_steps
        for eps in epss:
            out[f"{key}@{eps:.5f}"] = 100 * robust_accuracy(model, x, y, kind, float(eps), norm, steps,
                                                             backend=backend, n_classes=n_classes, seed=seed,
                                                             aa_version=aa_version)
    return out
