"""Verdicts and measured explanations that the summaries decide from their tables: JaSMin App. E per head, the
patch-size axis of LoFAST Fig. 2, Castin §5.2's radius, the post-LN block's claim on text."""
import numpy as np
import pandas as pd


def _heads(jasmin_lower: bool):
    rows = []
    for model, scale in (("vit", 10.0), ("vit (JaSMin k=10 lam=1e-2 mean)", 2.0 if jasmin_lower else 20.0)):
        for layer in range(2):
            for head in range(2):
                for sample in range(3):
                    rows.append(dict(model=model, scope="head", kind="upper", layer=layer, head=head, sample=sample,
                                     truth=scale * (1 + 0.1 * sample), dataset="fashion_mnist", vit_d=64,
                                     vit_depth=4))
    return pd.DataFrame(rows)


def test_per_head_verdict_counts_the_heads_jasmin_lowers():
    from experiments.leaderboard.figures.verdict import per_head_verdict

    assert "**reproduced**: lower in 4 of 4 heads" in per_head_verdict(_heads(True))
    assert "**not reproduced**: lower in 0 of 4 heads" in per_head_verdict(_heads(False))
    assert per_head_verdict(_heads(True).query("model == 'vit'")) == ""


def _cert(clean, cert, margins):
    rows = []
    for p, c, a, m in zip((4, 7, 14), clean, cert, margins):
        base = dict(layers=2, heads=8, vo_norm=0.5, patch=p, bound="fine", clean_acc=c)
        rows.append(dict(base, kind="curve", eps=0.1, certified_acc=a))
        rows += [dict(base, kind="radius", eps=np.nan, margin=m, zeta_mean=1.2) for _ in range(3)]
    return pd.DataFrame(rows)


def test_patch_axis_explains_clean_and_certified_rising_together():
    from experiments.lofast.figures.certified import patch_verdict

    text = patch_verdict(_cert((0.6, 0.7, 0.8), (0.3, 0.5, 0.6), (0.005, 0.02, 0.05)), 0.1)
    assert "both rise with the patch size" in text and "x10.0" in text and "at most 0 %" in text
    text = patch_verdict(_cert((0.8, 0.7, 0.6), (0.3, 0.5, 0.6), (0.005, 0.02, 0.05)), 0.1)
    assert "move against each other" in text


def _adv(layer_growth_small_r, layer_growth_big_r):
    rows = []
    for r, extra in ((1.0, layer_growth_small_r), (4.0, layer_growth_big_r)):
        for n in (2, 4, 8, 16, 32):
            head = n ** 0.5
            rows.append(dict(model="gpt2", pretrained=False, layer=0, masked=False, map="layer", radius_factor=r,
                             head=0, gamma=1.0, n=n, lipschitz_head=head, lipschitz=head + 10 * n ** extra))
    return pd.DataFrame(rows)


def test_radius_note_decomposes_the_layer_slope_and_counts_the_direction():
    from experiments.castin.figures.adversarial import radius_note

    text = radius_note(_adv(0.0, 0.5))
    assert "head alone 0.50" in text and "smaller R grows more slowly in 1 of 1 panels" in text
    assert "in 0 of 1 panels" in radius_note(_adv(0.5, 0.0))


def test_block_verdict_is_decided_on_text_by_the_true_constant():
    from experiments.castin.figures.block import block_verdict

    rows = []
    for inputs, true, est in (("text", 0.25, 0.35), ("random_tokens", 0.0, 0.25)):
        for n in (2, 4, 8, 16, 32, 64):
            rows.append(dict(model="minilm", pretrained=True, layer=5, inputs=inputs, n=n,
                             lipschitz_block=n ** true, paper_estimator=n ** est))
    text = block_verdict(pd.DataFrame(rows))
    assert "**reproduced**" in text and "true 0.25, estimator 0.35" in text
    assert "over-states the slope in 1 of 1" in text
    flat = pd.DataFrame([dict(r, lipschitz_block=1.0) if r["inputs"] == "text" else r for r in rows])
    assert "**not reproduced**" in block_verdict(flat)


def _c(vo_norm, cert):
    return dict(kind="curve", bound="fine", eps=0.1, layers=2, heads=8, patch=7, vo_norm=vo_norm,
                certified_acc=cert, clean_acc=0.7)


def test_constraint_verdict_compares_c_one_with_the_same_architecture():
    from experiments.lofast.figures.constraint import constraint_verdict

    assert "**reproduced**" in constraint_verdict(pd.DataFrame([_c(0.5, 0.3), _c(1.0, 0.01)]), 0.1)
    assert "**partly reproduced**" in constraint_verdict(pd.DataFrame([_c(0.5, 0.3), _c(1.0, 0.2)]), 0.1)
    assert "**not reproduced**" in constraint_verdict(pd.DataFrame([_c(0.5, 0.3), _c(1.0, 0.4)]), 0.1)
    assert constraint_verdict(pd.DataFrame([_c(0.5, 0.3)]), 0.1) == ""


def test_key_bias_changes_neither_the_map_nor_its_jacobian():
    """Remark E.1 on random weights with non-zero biases: P and f equal to rounding, and the dense float64
    Jacobian's spectral norm equal, with and without b_K; removing b_Q does change them (the check can fail)."""
    import dataclasses

    import torch

    from harness.kernels.attention import AttentionWeights, attention, probs

    g = torch.Generator().manual_seed(0)
    h, d, dh, n = 2, 6, 3, 5
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    w = AttentionWeights(r(h, d, dh), r(h, d, dh), r(h, d, dh), r(h, dh, d), bq=r(h, dh), bk=r(h, dh), bv=r(h, dh),
                         bo=r(d))
    X = r(n, d)
    no_bk, no_bq = dataclasses.replace(w, bk=None), dataclasses.replace(w, bq=None)

    def jac_norm(ww):
        J = torch.autograd.functional.jacobian(lambda x: attention(x, ww), X).reshape(n * d, n * d)
        return float(torch.linalg.matrix_norm(J, ord=2))

    assert float((probs(X, w) - probs(X, no_bk)).abs().max()) < 1e-14
    assert float((attention(X, w) - attention(X, no_bk)).abs().max()) < 1e-12
    assert abs(jac_norm(w) - jac_norm(no_bk)) < 1e-10 * jac_norm(w)
    assert float((probs(X, w) - probs(X, no_bq)).abs().max()) > 1e-3


def test_biases_verdict_fails_when_the_key_bias_matters():
    from experiments.castin.figures.biases import biases_verdict

    row = dict(model="minilm", pretrained=True, corpus="alice", has_bk=True, max_dp=1e-15, rel_df=1e-15,
               lipschitz=2.0, lipschitz_no_bk=2.0)
    assert "**reproduced**" in biases_verdict(pd.DataFrame([row]))
    assert "**not reproduced**" in biases_verdict(pd.DataFrame([dict(row, max_dp=0.1)]))
    assert "**not reproduced**" in biases_verdict(pd.DataFrame([dict(row, lipschitz_no_bk=2.1)]))


def test_gamma_one_rows_are_exact_and_the_verdict_names_p_equal_k():
    """Uniform on k entries: g_1 = 1/k, g_k = (1/k)(1 - 1/k) (x_(k+1) = 0), so §4's range k <= p fails at p = k."""
    from types import SimpleNamespace

    from experiments.jasmin.figures.gamma_one import gamma_one_verdict
    from experiments.jasmin.gamma_one import JasminGammaOne

    rows = JasminGammaOne().run({"n": [6], "k": [3], "samples": 50}, SimpleNamespace(seed=0))
    u = {r["p"]: r for r in rows if r["kind"] == "uniform_top_p"}
    assert abs(u[3]["g1"] - 1 / 3) < 1e-15 and abs(u[3]["gk"] - (1 / 3) * (2 / 3)) < 1e-15
    assert all(u[p]["gap"] < 1e-15 for p in (1, 4, 5, 6)) and u[2]["gk"] == 0.0
    text = gamma_one_verdict(pd.DataFrame(rows))
    assert "**partly reproduced**" in text and "exactly the p = k ones (1)" in text
