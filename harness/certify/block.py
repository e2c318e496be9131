"""Blocks of a whole-model certificate and their composition (docs/math.md §6).

A model is a chain of blocks acting on a token matrix X (n, d) in float64. Each block knows its nominal map
`forward(X)` and a certificate `change(prep, r, rows)`: an upper bound on sup ||f(X') - f(X)||_F over
||X' - X||_F <= r, where `prep = block.prepare(X)` holds whatever the certificate computes once per input (norms,
Lanczos estimates) and `rows` is None (any row of X may move) or the indices of the only rows that may move (one
word's embedding). `change` returns (bound, rows of the output that may move, name of the certificate that gave
the bound).

Composition is sound because each bound holds for every point of its input ball: if X_k' lies within r_k of the
nominal X_k, then X_{k+1}' = f_k(X_k') lies within change_k(r_k) of the nominal X_{k+1} = f_k(X_k), so
r_{k+1} = change_k(X_k, r_k) bounds the next block's input ball. `Chain` propagates r through its blocks;
`Residual` is x + g(x) with g a chain (change <= r + change_g, the triangle inequality).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import torch

Tensor = torch.Tensor
Rows = Optional[Tuple[int, ...]]  # None: every row may move; else the rows that may


class Block:
    """One map of the model with a certified change over an l2 ball around each nominal input."""

    name = "block"
    rowwise = False  # acts on each row separately (the moving rows stay the moving rows)

    def forward(self, X: Tensor) -> Tensor:  # (..., n, d) -> (..., n, d'): batched over leading dims
        raise NotImplementedError

    def prepare(self, X: Tensor) -> Any:
        """What the certificate computes once per nominal input X (the default: X itself)."""
        return X

    def change(self, prep: Any, r: float, rows: Rows) -> Tuple[float, Rows, str]:
        """(bound on the output change for input changes of norm <= r confined to `rows`, output rows that may
        move, the certificate's name)."""
        raise NotImplementedError

    def jacobian(self, prep: Any, r: float, rows: Rows) -> Optional[Tuple[float, float]]:
        """(J0, D) for the network route: J0 >= ||J_f(X)|| at the nominal input and D >= sup ||J_f(X') - J_f(X)||
        over the ball of radius r (inputs moving in `rows`); None where the block cannot bound them."""
        return None


@dataclass
class Prepared:
    """A block with its per-input state, its nominal input and output."""

    block: Block
    prep: Any
    X: Tensor
    Y: Tensor


@dataclass
class Trace:
    """The nominal pass of a chain at one input: every block's prepared state, in order."""

    steps: List[Prepared] = field(default_factory=list)

    @property
    def output(self) -> Tensor:
        return self.steps[-1].Y

    def propagate(self, r: float, rows: Rows = None) -> Tuple[float, Rows, List[Tuple[str, str, float]]]:
        """Propagate an input radius r through every step: (output radius, moving rows, per step (block name,
        certificate, radius after it))."""
        out = []
        for s in self.steps:
            if r == 0.0 or (rows is not None and len(rows) == 0):
                r, rows, how = 0.0, (), "unchanged"
            else:
                r, rows, how = s.block.change(s.prep, r, rows)
            out.append((s.block.name, how, float(r)))
        return float(r), rows, out

    def jacobian(self, r: float, rows: Rows = None) -> Optional[Tuple[float, float]]:
        """(J0, D) of the whole chain at radius r from each block's on its propagated ball: for f_2 o f_1,
        J(x') - J(x) = (J_2(y') - J_2(y)) J_1(x') + J_2(y) (J_1(x') - J_1(x)), so D <= D_2 (J0_1 + D_1) + J0_2 D_1
        and J0 <= J0_2 J0_1."""
        J, D = 1.0, 0.0
        for s in self.steps:
            if r == 0.0 or (rows is not None and len(rows) == 0):
                continue
            got = s.block.jacobian(s.prep, r, rows)
            if got is None:
                return None
            Jk, Dk = got
            J, D = Jk * J, Dk * (J + D) + Jk * D
            r, rows, _ = s.block.change(s.prep, r, rows)
        return J, D


class Chain(Block):
    """Blocks applied in order."""

    def __init__(self, blocks: Sequence[Block], name: str = "chain"):
        self.blocks = list(blocks)
        self.name = name
        self.rowwise = all(b.rowwise for b in self.blocks)

    def trace(self, X: Tensor) -> Trace:
        t = Trace()
        for b in self.blocks:
            Y = b.forward(X)
            t.steps.append(Prepared(b, b.prepare(X), X, Y))
            X = Y
        return t

    def forward(self, X: Tensor) -> Tensor:
        for b in self.blocks:
            X = b.forward(X)
        return X

    def prepare(self, X: Tensor) -> Trace:
        return self.trace(X)

    def change(self, prep: Trace, r: float, rows: Rows):
        r, rows, steps = prep.propagate(r, rows)
        return r, rows, "+".join(sorted({how for _, how, _ in steps if how != "unchanged"})) or "unchanged"

    def jacobian(self, prep: Trace, r: float, rows: Rows):
        return prep.jacobian(r, rows)


class Residual(Block):
    """x + g(x): change <= r + change_g(r) (the triangle inequality); rows of x and of g's output may move."""

    def __init__(self, inner: Block, name: str = "residual"):
        self.inner, self.name, self.rowwise = inner, name, inner.rowwise

    def forward(self, X: Tensor) -> Tensor:
        return X + self.inner.forward(X)

    def prepare(self, X: Tensor) -> Any:
        return self.inner.prepare(X)

    def change(self, prep: Any, r: float, rows: Rows):
        g, grows, how = self.inner.change(prep, r, rows)
        moved = None if rows is None or grows is None else tuple(sorted(set(rows) | set(grows)))
        return r + g, moved, how

    def jacobian(self, prep: Any, r: float, rows: Rows):
        got = self.inner.jacobian(prep, r, rows)
        return None if got is None else (1.0 + got[0], got[1])


class SelectRow(Block):
    """X -> X[i:i+1] (the [CLS] token a classifier reads): 1-Lipschitz; no change when row i cannot move."""

    def __init__(self, index: int = 0, name: str = "pool"):
        self.index, self.name = int(index), name

    def forward(self, X: Tensor) -> Tensor:
        return X[..., self.index:self.index + 1, :]

    def change(self, prep, r: float, rows: Rows):
        if rows is not None and self.index % prep.shape[0] not in {i % prep.shape[0] for i in rows}:
            return 0.0, (), "unchanged"
        return r, (0,), "row"

    def jacobian(self, prep, r: float, rows: Rows):
        return 1.0, 0.0


class Linear(Block):
    """X -> X W + b applied to each row (W (d, d')): change <= ||W|| r (its exact spectral norm)."""

    rowwise = True

    def __init__(self, W: Tensor, b: Optional[Tensor] = None, name: str = "linear"):
        self.W, self.b, self.name = W, b, name
        self.norm = float(torch.linalg.matrix_norm(W, ord=2))

    def forward(self, X: Tensor) -> Tensor:
        Y = X @ self.W
        return Y if self.b is None else Y + self.b

    def change(self, prep, r: float, rows: Rows):
        return self.norm * r, rows, "spectral norm"

    def jacobian(self, prep, r: float, rows: Rows):
        return self.norm, 0.0


def margins_certified(logits: Tensor, y: int, W: Tensor, r: float) -> bool:
    """Whether logits (C,) = p W + b stays with argmax y for every p' within r of p: for each j != y the logit
    difference moves by at most ||W[:, y] - W[:, j]|| r (Cauchy-Schwarz), so it keeps its sign when its nominal
    value exceeds that."""
    diff = logits[y] - logits  # (C,)
    reach = torch.linalg.vector_norm(W[:, y:y + 1] - W, dim=0) * r  # (C,)
    others = torch.ones_like(diff, dtype=torch.bool)
    others[y] = False
    return bool((diff[others] > reach[others]).all())
