"""harness.models.certify: Theorem 1 propagation equals harness.bounds.lofast, and Prop. 1 certificates are sound."""

import pytest
import torch

from harness.bounds import lofast, lofast_refined
from harness.kernels.attention import AttentionWeights
from harness.kernels.pgd import pgd_maximize
from harness.models.certify import BOUNDS, BUILTIN, NEEDS_M, certify, layer_delta, layer_terms, margins, pgd_attack
from harness.models.lipvit import LipViT

DT = torch.float64


def _unit_rows(B, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(B, n, d, generator=g, dtype=DT)
    return Z / Z.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("residual", [True, False])
def test_layer_delta_equals_lofast_delta(residual):
    w = AttentionWeights.random(8, 2, scale=0.8, dtype=DT, generator=torch.Generator().manual_seed(3))
    Z = 1.5 * _unit_rows(3, 5, 8, 0)
    t = layer_terms(Z, w, residual=residual)
    e = torch.tensor([0.0, 0.05, 0.3], dtype=DT)
    ref = {"fine": lofast.delta(Z, w, e, residual=residual),
           "coarse": lofast.delta(Z, w, e, residual=residual, fine=False),
           "sharp": lofast.delta(Z, w, e, residual=residual, softmax_lip=0.5),
           "naive": lofast.naive_delta1(Z, w, e, residual=residual) + lofast.delta2(Z, w, e, fine=False),
           "refined": lofast_refined.delta(Z, w, e, residual=residual)}
    for b in BOUNDS:
        assert torch.allclose(layer_delta(t, e, b), ref[b], rtol=1e-8, atol=1e-12), b
    # ordering: refined <= sharp <= fine <= coarse <= naive (||M|| <= xi, c = 1/2 <= 1, zeta <= eq. 9)
    v = [layer_delta(t, e, b) for b in ("refined", "sharp", "fine", "coarse", "naive")]
    for a, b in zip(v, v[1:]):
        assert (a <= b + 1e-12).all()
    with pytest.raises(ValueError, match="unknown bound"):
        layer_delta(t, e, "exact")
    with pytest.raises(ValueError, match="exact"):
        layer_delta(layer_terms(Z, w, fine=False), e, "fine")


def test_layer_delta_above_pgd_sensitivity():
    w = AttentionWeights.random(8, 2, scale=1.0, dtype=DT, generator=torch.Generator().manual_seed(5))
    Z = _unit_rows(2, 4, 8, 1)
    t = layer_terms(Z, w)
    for eps in (0.05, 0.5):
        lower = lofast.pgd_sensitivity(Z, w, eps, residual=True, steps=30, restarts=2)
        e = torch.full((2,), eps, dtype=DT)
        assert (layer_delta(t, e, "sharp") >= lower - 1e-10).all()
        assert (layer_delta(t, e, "refined") >= lower - 1e-10).all()


def test_margins():
    logits = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0]], dtype=DT)
    assert torch.allclose(margins(logits, torch.tensor([1, 2])), torch.tensor([1.0, -4.0], dtype=DT))


@pytest.fixture(scope="module")
def trained():
    """A tiny LipViT (untrained: Prop. 1 is about the predicted label, so labels are its own predictions, float64)."""
    from harness.data.images import load_images

    torch.manual_seed(0)
    m = LipViT(image_size=28, patch=14, d=16, depth=2, heads=2, vo_norm=0.5).double().eval()
    X, _, _ = load_images("synthetic", split="test", limit=12, size=28, n_synthetic=12)
    X = X.double()
    with torch.no_grad():
        y = m(X).argmax(-1)
    y[:2] = (y[:2] + 1) % 10  # two misclassified points: never certified
    return m, X, y


def test_output_bound_is_sound_end_to_end(trained):
    """||F(u') - F(u)|| found by PGD never exceeds the propagated bound (every built-in certificate)."""
    m, X, y = trained
    X, y = X[:6], y[:6]
    cert = certify(m, X, y)
    with torch.no_grad():
        F0 = m(X)
    for eps in (0.01, 0.1, 2.0):
        lower = pgd_maximize(lambda v: (m(v) - F0).norm(dim=-1), X, eps, steps=10, restarts=2, batch_dims=1).value
        e = torch.full((6,), eps, dtype=DT)
        for b in BUILTIN:
            assert (cert.output_bound(e, b) >= lower - 1e-10).all(), (b, eps)


def test_certified_points_survive_pgd_and_radius_is_consistent(trained):
    m, X, y = trained
    cert = certify(m, X, y)
    assert 0.5 < cert.correct.float().mean() < 1
    radii = {b: cert.radius(b) for b in BUILTIN}
    for b in BUILTIN:  # the minimum of the certificates certifies at least as far as each of them
        assert (radii["best"] >= radii[b] - 1e-12).all(), b
    assert (radii["best"] > radii["refined"] * (1 + 1e-3)).any()  # the second-order certificate adds radius here
    won = cert.best_choice(radii["best"])
    assert len(won) == len(y) and set(won) <= set(BUILTIN) - {"best"}
    assert (radii["refined"] >= radii["sharp"] - 1e-12).all()
    assert (radii["sharp"] >= radii["fine"] - 1e-12).all() and (radii["fine"] >= radii["coarse"] - 1e-12).all()
    assert (radii["coarse"] >= radii["naive"] - 1e-12).all()
    r = radii["fine"]
    pos = r > 0
    assert pos.any()
    assert cert.certified(r * (1 - 1e-9), "fine")[pos].all()
    assert not cert.certified(r * (1 + 1e-6) + 1e-12, "fine").any()
    prev = None
    r_best = radii["best"]
    for eps in (0.0, float(r[pos].min()) / 2, float(r.median()), float(r.max()) * 0.9, float(r_best.max()) * 0.9):
        ok = cert.certified(eps, "best")
        attack = pgd_attack(m, X, y, eps, steps=10, restarts=2) if eps > 0 else -cert.margin
        robust = cert.correct & (attack < 0)
        assert not (ok & ~robust).any(), f"a certified point was broken at eps={eps}"
        assert ok.float().mean() <= robust.float().mean()
        if prev is not None:
            assert not (ok & ~prev).any()  # monotone in eps
        prev = ok


def test_certify_checks_inputs(trained):
    m, X, y = trained
    with pytest.raises(ValueError, match="labels"):
        certify(m, X[:3], y[:2])


def test_text_model_certificate_sound():
    """LipText: perturbations of the unit-norm word embeddings, L_in = embed_scale; bound >= PGD."""
    from harness.models.lipvit import LipText

    torch.manual_seed(2)
    m = LipText(vocab=30, n=6, d=8, depth=2, heads=2, vo_norm=0.75, embed_scale=0.5).double().eval()
    E = m.embed_ids(torch.randint(0, 30, (4, 6))).detach()
    with torch.no_grad():
        y = m(E).argmax(-1)
        F0 = m(E)
    cert = certify(m, E, y)
    assert cert.L_in == 0.5
    for eps in (0.2, 1.0):
        lower = pgd_maximize(lambda v: (m(v) - F0).norm(dim=-1), E, eps, steps=10, restarts=2, batch_dims=1).value
        for b in ("sharp", "refined", "second_order", "best"):
            assert (cert.output_bound(torch.full((4,), eps, dtype=DT), b) >= lower - 1e-10).all()


def test_certificates_use_certified_upper_estimates(trained):
    """Certificates use the KW/deterministic upper estimates of zeta and ||M_l|| (>= the Lanczos values)."""
    m, X, y = trained
    cert = certify(m, X[:6], y[:6])
    for t in cert.layers:
        assert (t.zeta_up >= t.zeta).all() and (t.m_up >= t.m).all() and (t.m_up <= t.xi * (1 + 1e-9)).all()
        assert (t.zeta_up <= t.naive1 * (1 + 1e-9)).all()
    assert 0 < cert.guarantee < 1e-6
    for b in ("fine", "sharp", "refined", "coarse"):
        r_cert, r_ritz = cert.radius(b), cert.radius(b, certified=False)
        assert (r_cert <= r_ritz + 1e-12).all() and (r_cert >= 0.9 * r_ritz).all(), b


def test_guarantee_per_bound_counts_the_estimates_it_uses(trained):
    """naive rests on nothing estimated (0); coarse on zeta per layer; fine / sharp on zeta and every ||M_l||;
    second_order on the layer's ||J|| and every ||M_l||; best on all of them (= the certificate's guarantee)."""
    m, X, y = trained
    cert = certify(m, X[:4], y[:4])
    L, h = len(cert.layers), cert.layers[0].m_up.shape[-1]
    assert L == 2 and h == 2
    assert cert.guarantee_of("naive") == 0.0
    assert cert.guarantee_of("coarse") == pytest.approx(L * lofast.FAIL_PROB)
    for b in (*NEEDS_M, "second_order"):
        assert cert.guarantee_of(b) == pytest.approx(L * (1 + h) * lofast.FAIL_PROB)
    assert cert.guarantee_of("best") == pytest.approx(L * (2 + h) * lofast.FAIL_PROB) == pytest.approx(cert.guarantee)
    with pytest.raises(ValueError, match="unknown bound"):
        cert.guarantee_of("tight")
    coarse = certify(m, X[:4], y[:4], fine=False)  # no ||M_l|| estimates: the bounds using them cannot be counted
    assert coarse.guarantee == coarse.guarantee_of("coarse") == pytest.approx(L * lofast.FAIL_PROB)
    assert coarse.guarantee_of("naive") == 0.0
    for b in NEEDS_M:
        with pytest.raises(ValueError, match="fine=True"):
            coarse.guarantee_of(b)


def test_certify_rows_and_summary_report_the_guarantee(trained):
    """Every certification row carries its bound's failure probability; the summary states it per bound."""
    import pandas as pd

    from experiments.lofast.figures import certified as plots
    from harness.models.lofast_eval import certify_rows

    m, X, y = trained
    rows = certify_rows(m, X[:4], y[:4], [0.0, 0.1], pgd_steps=2, pgd_restarts=1)
    t = pd.DataFrame(rows).assign(layers=2, heads=2, vo_norm=0.5, test_acc_full=0.5)
    g = t.groupby("bound").guarantee.unique()
    assert all(len(v) == 1 for v in g) and g["naive"][0] == 0 and 0 < g["coarse"][0] < g["fine"][0] == g["sharp"][0]
    line = plots.guarantee_line(t[t.kind == "curve"])
    assert "naive 0 (deterministic)" in line and f"fine {g['fine'][0]:.1e}" in line and "1e-09" in line
    assert "not recorded" in plots.guarantee_line(t[t.kind == "curve"].drop(columns="guarantee"))
    assert line in plots.certified_summary(t, 0.1)


def test_patch_size_axis_is_labelled_and_summarized():
    """LoFAST Fig. 2's patch-size axis: configs at several patch sizes get -p<patch> labels and a summary line."""
    import pandas as pd

    from experiments.lofast.figures import certified as plots

    rows = [dict(kind="curve", layers=2, heads=8, vo_norm=0.5, patch=p, bound=b, eps=e, certified_acc=acc,
                 clean_acc=0.8) for p, acc in ((4, 0.3), (7, 0.5)) for b in ("fine", "sharp") for e in (0.0, 0.1)]
    t = pd.DataFrame(rows)
    assert set(plots.config_label(t)) == {"L2-h8-c0.5-p4", "L2-h8-c0.5-p7"}
    line = plots.patch_verdict(t, 0.1)
    assert "patch 4 (49 patches)" in line and "patch 7 (16 patches)" in line and "fine 0.300" in line
    one = t[t.patch == 7]
    assert set(plots.config_label(one)) == {"L2-h8-c0.5"} and plots.patch_verdict(one, 0.1) == ""
