"""Start vectors of the Lanczos estimates: Gaussian, seeded by a cryptographic hash of the operator's data.

The Kuczynski-Wozniakowski certificate (docs/math.md §4) holds with probability >= 1 - fail_prob over a start drawn
independently of the matrix. A fixed public seed is not: whoever builds a model can read the code, draw the same
start and put the top singular vector where the start has no component. Here the start of every operator is drawn
from a generator seeded with BLAKE2b over the operator's data (the input X of that batch element, the weights, the
quantity's name, the caller's `seed` and the problem's shape and dtype), so

- the same model and input give the same start, and the same numbers (`run_all.py --verify` holds);
- a model's author cannot know the start before fixing the model and the input: every change of either draws a
  new, unrelated start (the hash modelled as a random oracle). An author who tries Q models or inputs in search of
  a bad start fails each try with probability <= fail_prob, so all Q with probability >= 1 - Q fail_prob
  (at settings.FAIL_PROB, one in a billion, about 10^9 full Lanczos runs to expect one bad start).

`seed` still selects among starts (a second, independent draw for the same data), as before.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Optional, Sequence

import torch

Tensor = torch.Tensor

DIGEST = 16  # bytes of BLAKE2b; a torch seed takes the first 8 (63 bits)


def _feed(h, t: Optional[Tensor]) -> None:
    """Hash one tensor (dtype, shape and values) or a placeholder for an absent one."""
    if t is None:
        h.update(b"none;")
        return
    t = t.detach()
    h.update(f"{t.dtype};{tuple(t.shape)};".encode())
    if t.is_complex():  # NumPy has no bfloat16, and complex values are hashed as their (real, imag) pairs
        t = torch.view_as_real(t)
    elif t.dtype == torch.bfloat16:
        t = t.to(torch.float64)
    h.update(t.to("cpu").contiguous().numpy().tobytes())


def data_digest(tensors: Iterable[Optional[Tensor]], tag: str = "") -> bytes:
    """BLAKE2b digest of `tag` and every tensor (dtype, shape, values), in order."""
    h = hashlib.blake2b(digest_size=DIGEST)
    h.update(f"attnlip-start;{tag};".encode())
    for t in tensors:
        _feed(h, t)
    return h.digest()


def weight_tensors(w) -> Sequence[Optional[Tensor]]:
    """The tensors of an attention-weights object (AttentionWeights, BatchedWeights or anything holding wq, wk, wv,
    wo and optional biases), in a fixed order; a tensor itself is returned as the one item."""
    if w is None:
        return ()
    if isinstance(w, Tensor):
        return (w,)
    return tuple(getattr(w, f, None) for f in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"))


def gaussian_rows(X: Tensor, N: int, seed: int, tag: str, data: Sequence[Optional[Tensor]] = (),
                  rows: Optional[int] = None) -> Tensor:
    """(B, N) Gaussian start rows in X's dtype and device, row r drawn from a generator seeded by the hash of
    (tag, seed, N, the shared `data` such as the weights, the batch element of X the row belongs to, and the row's
    place among that element's rows).

    X (..., n, d) holds I = prod(X.shape[:-2]) inputs; B = rows (default I) must be a multiple of I, the rows of
    one input consecutive (e.g. one row per head: B = I h). A row's start depends on its own input and the shared
    data only, not on the other inputs of the batch."""
    Xf = X.detach()
    I = int(Xf.shape[:-2].numel()) if Xf.dim() >= 2 else 1
    B = I if rows is None else int(rows)
    if I == 0 or B == 0:
        return torch.empty(B, N, dtype=X.dtype, device=X.device)
    if B % I:
        raise ValueError(f"gaussian_rows: {B} rows for {I} inputs (rows must be a multiple of the inputs)")
    per = B // I
    shared = data_digest(data, f"{tag};seed={int(seed)};N={int(N)}")
    flat = Xf.reshape(I, *Xf.shape[-2:]) if Xf.dim() >= 2 else Xf.reshape(1, -1)
    out = torch.empty(B, N, dtype=X.dtype, device=X.device)
    g = torch.Generator(device=X.device)
    for i in range(I):
        base = hashlib.blake2b(shared, digest_size=DIGEST)
        _feed(base, flat[i])
        for j in range(per):
            h = base.copy()
            h.update(f"row={j}".encode())
            g.manual_seed(int.from_bytes(h.digest()[:8], "little") & (2 ** 63 - 1))
            out[i * per + j] = torch.randn(N, dtype=X.dtype, device=X.device, generator=g)
    return out
