"""One input rule for every bound and exact quantity (kernels.attention.check_pair): float32/float64 only, weights of
X's dtype and device (never cast silently), empty batches give empty results, everything else a ValueError that
names the argument."""
import pytest
import torch

from harness.bounds import castin, jasmin, kim, lofast
from harness.kernels.attention import AttentionWeights

W = AttentionWeights.random(d=8, h=2, generator=torch.Generator().manual_seed(0))
X = torch.randn(3, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
FUNCS = {
    "jasmin": lambda X, w: jasmin.bound(X, w),
    "castin": lambda X, w: castin.bound(X, w),
    "kim": lambda X, w: kim.bound(X, w),
    "lofast.zeta": lambda X, w: lofast.zeta(X, w),
    "lofast.m_norms": lambda X, w: lofast.m_norms(X, w),
    "lofast.lipschitz_upper": lambda X, w: lofast.lipschitz_upper(X, w),
}


@pytest.mark.parametrize("name", FUNCS)
def test_empty_batch_gives_empty_result(name):
    out = FUNCS[name](X[:0], W)
    assert out.shape[0] == 0


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_refused_clearly(name, dtype):
    with pytest.raises(ValueError, match="only float32 and float64"):
        FUNCS[name](X.to(dtype), W.to(dtype=dtype))


@pytest.mark.parametrize("name", FUNCS)
def test_mismatched_weight_dtype_is_never_cast_silently(name):
    with pytest.raises(ValueError, match="weights have dtype"):
        FUNCS[name](X.float(), W)


@pytest.mark.parametrize("name", FUNCS)
def test_bad_inputs_name_the_argument(name):
    with pytest.raises(ValueError, match="feature dimension"):
        FUNCS[name](torch.randn(3, 4, 7, dtype=torch.float64), W)
    with pytest.raises(ValueError, match="floating"):
        FUNCS[name](torch.ones(3, 4, 8, dtype=torch.long), W)
    with pytest.raises(ValueError, match="w must be an AttentionWeights"):
        FUNCS[name](X, "not weights")


@pytest.mark.parametrize("h", [0, -1, 2.5])
def test_random_weights_reject_bad_heads(h):
    with pytest.raises(ValueError, match="h \\(number of heads\\)"):
        AttentionWeights.random(d=8, h=h)
