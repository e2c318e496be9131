"""Every setting that changes a computed number, named once with the reason for its value: the dtype vocabulary,
the iteration tolerances, the failure probabilities and step counts of the certified estimates, the size
thresholds that pick an algorithm, and the rounding slacks. Modules import their values from here; nothing
else in the toolkit writes one of these numbers.

Dtypes
- `DTYPES`: the dtype names ("float64", "float32", "float16", "bfloat16"), each the name of its torch dtype;
  `torch_dtype` is the one name -> torch map and validates a name (or a torch dtype) against them, once, where
  a name enters (RunConfig, analyze's options).
- `COMPUTE_DTYPES`: what the kernels compute in, float32 and float64 (half precisions round the n x n softmax
  maps and their Jacobians too coarsely for a bound to mean anything; they stay training dtypes).

Tolerances (three purposes, three names)
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

Certified estimates (Kuczynski-Wozniakowski upper estimates from a seeded Gaussian start, docs/math.md §4)
- `FAIL_PROB` = 1e-9: each estimate a certificate rests on (zeta, ||M_l||, the certified truth of the
  second-order certificate). Certification multiplies estimates over layers, heads and test points and states
  the union bound, so each one's probability is taken small; it costs ~log(1/p) products (KW's step count grows
  like ln(sqrt(N) / p) / sqrt(eps)), a few percent more than 1e-6.
- `REPORT_FAIL_PROB` = 1e-6: the certified upper estimate of a reported truth (`attnlip analyze`'s truth_upper,
  kernels.layer.certified_norm's default): one number per layer and input, read beside the Ritz value.
- `CERTIFY_EPS` = 1e-2: the relative KW eps on the squared norm that certification's first Lanczos cycle is run
  long enough for, so its upper estimates are <= 1/sqrt(0.99) (0.5 %) above the Ritz values.
- `CERT_ROUNDING` = 8: the rounding allowance of a certificate computed in certifying mode
  (bounds.input_state.InputState(certify=...)): its value is multiplied by 1 + CERT_ROUNDING (n + d) eps of the
  input's dtype, for the rounding of the norms and products Theorem 1's polynomial and the curvature term are
  evaluated from (each a dot product of length n or d, relative error <= (n + d) eps, a few of them multiplied:
  twice that margin; 5.4e-5 in float32 at n + d = 56, 1e-13 in float64).
- `CERTIFY_STEPS` = 24: the Lanczos products before a reported truth may stop (analyze). After k products KW's
  relative eps on sigma^2 is (ln(1.648 sqrt(N) / p) / (2k - 1))^2: at k = 24 and p = 1e-6 that is 0.14 (n x d =
  512) to 0.20 (512 tokens of BERT-base), so truth_upper is within 8-12 % of the Ritz value at a cost of at most
  a few products beyond convergence; a longer first cycle tightens it.

Algorithm choices by size
- `KRYLOV_BYTES` = 128 MiB: the memory budget of the Lanczos basis of the bound norms (krylov + 1 copies of the
  flat batch of iterates), which sets the basis size between `KRYLOV_MIN` and `KRYLOV_MAX` vectors.
- `PARTIAL_MIN_DIM` = 4096, `PARTIAL_MIN_BYTES` = 32 MiB: reorth="auto" switches from full to Simon's partial
  reorthogonalization from this operator dimension or this size of the batch's basis on (below, the whole basis
  stays in cache and full reorthogonalization is cheaper than the bookkeeping; docs/notes/kernels.md).
- `WORKSPACE_BYTES` = 2 x `KRYLOV_BYTES`: Lanczos bases up to this size on the CPU reuse one buffer kept between
  solver calls (per thread, shared by every dtype) instead of a fresh mapping faulted in page by page on every
  call (kernels.lanczos_steps.basis_buffer). The bound norms' basis is `KRYLOV_BYTES` plus its extra vector, so it
  fits unless `KRYLOV_MIN` vectors alone exceed the budget or a caller asks for more (those allocate fresh); the
  cost is memory held after the call, up to this much per thread that ran a solver.
- `DENSE_MAX` = 384: n * d up to which kernels.layer.lipschitz forms J_F(X) explicitly (one batched product)
  and takes its SVD instead of iterating (below it the dense route is faster and exact).
- `CERT_DENSE_MAX` = 1024: n * d up to which a certified truth (kernels.layer.truth with certify) is the explicit
  Jacobian's SVD, exact up to its rounding allowance, instead of a Kuczynski-Wozniakowski estimate (which inflates
  the value by its relative eps and needs about as many products as the space has dimensions at this size).
- `STREAM_BLOCK_Q` = 256, `STREAM_BLOCK_K` = 512: the query rows x key columns of one block of the streamed
  products (kernels.streamed): h x 256 x 512 probabilities per temporary (32 MiB in float64 at 32 heads), large
  enough that the block GEMMs run near the machine's GEMM rate, small enough that a few temporaries stay far below
  the O(n d) state at long n.
- `MAPS_MEMORY_FRACTION` = 0.25: the layer Jacobian keeps its h x n x n maps (kernels.layer's materialised route)
  while the maps and their product temporaries (4 maps) take at most this fraction of the memory available when
  the operator is built; beyond it the streamed route runs (kernels.route).
- `TRUTH_KRYLOV` = 30: the certified truth's Lanczos basis (kernels.layer.certified_norm, at least steps + 2 so
  the certificate's first cycle is unrestarted): a restart every 30 products keeps the Ritz values' bookkeeping
  small beside the layer's products.
- `BASIS_MEMORY_FRACTION` = 0.8: the certified truth's Lanczos basis may take this fraction of the memory available
  after the operator's state (the rest: a product's temporaries): its size, and whether it is stored in float32
  (kernels.route).
- `SUSPICIOUS_STEPS` = 2: a caller's start vector that converges within this many products is checked again from
  a random start (it may have been orthogonal to the top singular vector).
- `SMALL_MAX_BATCH` = 8: operators per call up to which kernels.small's NumPy Lanczos takes a small problem; above
  it the batched torch solver amortizes its dispatch over the batch (docs/notes/kernels.md).

Iteration budgets (defaults of the kernels' keyword arguments; a caller may pass its own)
- `ITERS` = 2000: the product cap of an iterative norm (power / Lanczos on J^T J or a Gram operator). Every
  measured convergence takes tens of products (see truth_tol above); the cap only ends a run that cannot converge,
  which then reports converged=False instead of running on.
- `KRYLOV` = 40: the Lanczos basis size of the solvers that restart (kernels.power, kernels.small): enough for the
  top singular value of the attention operators in one or two cycles, small enough to stay in cache.
- `CHECK_EVERY` = 3, `MIN_STEPS` = 1: the NumPy Lanczos (kernels.small) tests its residual every third step after
  at least one, as the torch solver does (kernels.krylov), so both stop at the same product counts.
- `PGD_STEPS` = 50, `PGD_RESTARTS` = 4: projected gradient ascent's steps and random restarts (kernels.pgd); the
  lower bounds it gives move by well under 1 % beyond 50 steps on the studied layers. `RANDOM_SEARCH_SAMPLES` = 64:
  random points on the sphere of kernels.pgd.random_search_maximize.
- `PAPER_ESTIMATOR_ITERS` = 50: the power iterations of Castin et al.'s public estimator (kernels.power
  .paper_estimator), kept at their code's count to quantify its bias as published.
- `ANALYZE_EPS` = 1e-2, `ANALYZE_PGD_STEPS` = 20: `attnlip analyze`'s (and analyze()'s) radius of Theorem 1's
  delta and of PGD, and PGD's steps: a ball of 1 % of a unit-norm token's length, small enough that the
  certificates stay within a few times the local constant and large enough that PGD moves; 20 steps bring PGD's
  lower bound within a percent of 200 steps' on the studied layers.
- `JSM_BISECTION_STEPS` = 100: bisection steps of the exact softmax-Jacobian norm (kernels.softmax.jsm_norm); each
  halves the bracket [p_(2), p_(1)], so 100 steps reach float64's last bit on any bracket of width <= 1.

Mixed precision (float64 results from float32 iterations, bounds.lofast's mixed=True)
- `MIXED_TOL` = 1e-5: where the float32 phase stops (float32's own norm tolerance); float64 Lanczos from its
  Ritz vectors then reaches the requested float64 tol in a few products.
- `MIXED_SLACK` = 1e-4: the relative padding of the float32 KW estimate carried into float64 (float32 rounding of
  the Ritz value and of the residual, 6e-8 each, accumulated over at most a few hundred products).

Rounding slacks (in units of the dtype's machine epsilon)
- `RITZ_ROUNDING` = 100: the rounding of a computed Ritz value, by which the KW estimate is padded.
- `GRAM_ROUNDING` = 1000: the rounding of the eigenvalues of a small dense Gram matrix (kernels.operators).
- `SVD_ROUNDING` = 100: times N, the rounding of the top singular value of a dense N-column Jacobian
  (kernels.layer.lipschitz's exact route), by which its `upper` is padded.

Level 0: pure Python (torch is imported only to map a name to its dtype); every layer may import it.
"""
from __future__ import annotations

# ---- dtypes -----------------------------------------------------------------------------------------------------
DTYPES = ("float64", "float32", "float16", "bfloat16")
COMPUTE_DTYPES = ("float64", "float32")


def dtype_name(dtype) -> str:
    """torch.float64 or "float64" -> "float64" (not checked; see torch_dtype)."""
    return str(dtype).replace("torch.", "")


def check_dtype(dtype, allowed=DTYPES) -> str:
    """The dtype's name if it is one of `allowed` (names), else a ValueError naming them."""
    name = dtype_name(dtype)
    if not isinstance(dtype, str) and not str(dtype).startswith("torch.") or name not in allowed:
        raise ValueError(f"unknown dtype {dtype!r}: use {', '.join(allowed)}")
    return name


def torch_dtype(dtype, allowed=DTYPES):
    """A dtype name ("float64", ...) or torch dtype -> the torch dtype (the one name -> torch map), checked."""
    import torch

    return getattr(torch, check_dtype(dtype, allowed))


# ---- tolerances -------------------------------------------------------------------------------------------------
NORM_TOL = {"float64": 1e-10}  # float32 and lower: NORM_TOL_LOW
NORM_TOL_LOW = 1e-5
TRUTH_TOL = {"float64": 1e-6}  # float32 and lower: TRUTH_TOL_LOW
TRUTH_TOL_LOW = 1e-5
SOUND_RTOL = 1e-5


def norm_tol(dtype) -> float:
    """Lanczos / power tolerance for the norms bounds are built from: 1e-10 in float64, 1e-5 below."""
    return NORM_TOL.get(dtype_name(dtype), NORM_TOL_LOW)


def truth_tol(dtype) -> float:
    """Lanczos tolerance of the true local Lipschitz constant: 1e-6 in float64, 1e-5 below."""
    return TRUTH_TOL.get(dtype_name(dtype), TRUTH_TOL_LOW)


# ---- certified estimates ----------------------------------------------------------------------------------------
FAIL_PROB = 1e-9
REPORT_FAIL_PROB = 1e-6
CERTIFY_EPS = 1e-2
CERTIFY_STEPS = 24
CERT_ROUNDING = 8

# ---- algorithm choices by size ----------------------------------------------------------------------------------
KRYLOV_BYTES = 128 * 2**20
KRYLOV_MIN, KRYLOV_MAX = 8, 64
PARTIAL_MIN_DIM = 4096
PARTIAL_MIN_BYTES = 32 * 2**20
WORKSPACE_BYTES = 2 * KRYLOV_BYTES
DENSE_MAX = 384
CERT_DENSE_MAX = 1024
STREAM_BLOCK_Q, STREAM_BLOCK_K = 256, 512
MAPS_MEMORY_FRACTION = 0.25
BASIS_MEMORY_FRACTION = 0.8
TRUTH_KRYLOV = 30
SUSPICIOUS_STEPS = 2
SMALL_MAX_BATCH = 8

# ---- iteration budgets ------------------------------------------------------------------------------------------
ITERS = 2000
KRYLOV = 40
CHECK_EVERY = 3
MIN_STEPS = 1
PGD_STEPS = 50
PGD_RESTARTS = 4
RANDOM_SEARCH_SAMPLES = 64
PAPER_ESTIMATOR_ITERS = 50
JSM_BISECTION_STEPS = 100
ANALYZE_EPS = 1e-2
ANALYZE_PGD_STEPS = 20

# ---- mixed precision and rounding -------------------------------------------------------------------------------
MIXED_TOL = 1e-5
MIXED_SLACK = 1e-4
RITZ_ROUNDING = 100
GRAM_ROUNDING = 1000
SVD_ROUNDING = 100
