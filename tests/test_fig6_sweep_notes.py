"""What bound_leaderboard's and jasmin_sweep's / jasmin_jacobian_norm's figures and verdict say against JaSMin:
the per-n crossings of the paper's bounds (verdict), the panel matching Fig. 6's setting, the vs-n figure headed as
an extension with every pair of coinciding series named, the accuracy figure's paper columns and PGD steps, and
Fig. 4's data (CIFAR-100 only). Crafted tables, or the committed ones where the wording depends on real numbers;
plotting.finish is replaced by a recorder, so nothing is saved."""
from __future__ import annotations

import pandas as pd
import pytest

from harness.store.codehash import REPO_ROOT

FIG6 = "vit (JaSMin k=10 lam=1e-2 mean)"


def _board(gpt2_n64: dict) -> pd.DataFrame:
    """Head-scope medians: GPT-2 at n = 16 and 64 (n = 64's values given), a JaSMin-trained ViT at n = 17."""
    vals = {("gpt2", 16): {"jasmin": 100.0, "castin": 400.0, "kim": 1e6},
            ("gpt2", 64): gpt2_n64,
            (FIG6, 17): {"jasmin": 10.0, "castin": 95.0, "kim": 4e5}}
    return pd.DataFrame([dict(model=m, n=n, scope="head", method=k, ratio=v)
                         for (m, n), row in vals.items() for k, v in row.items()])


def test_verdict_names_the_n_where_castin_crosses_below_jasmin():
    from experiments.leaderboard.figures.verdict import leaderboard_verdict

    # pooled over n JaSMin (450) is below Castin (550); at n = 64 Castin is below JaSMin
    text = leaderboard_verdict(_board({"jasmin": 800.0, "castin": 700.0, "kim": 1e8}))
    assert "**partly reproduced** on 1 of 2 models including the JaSMin-trained ViT (not on gpt2)" in text
    assert "gpt2 at n = 64: Castin 700 below JaSMin 800 (pooled over n = 16, 64: JaSMin 450 below Castin 550)" in text
    assert "gpt2 n = 16: 100 / 400 / 1e+06, n = 64: 800 / 700 / 1e+08" in text
    same = leaderboard_verdict(_board({"jasmin": 500.0, "castin": 700.0, "kim": 1e8}))
    assert "**reproduced** on 2 of 2" in same and "No two of the paper's bounds change order with n." in same


def test_fig6_panel_is_the_jasmin_k10_vit():
    from experiments.leaderboard.figures.board import fig6_model, fig6_note

    assert fig6_model(["minilm", "vit", "vit (JaSMin k=10 lam=1e-2 max)", FIG6]) == FIG6
    assert fig6_model(["minilm", "vit"]) is None
    note = fig6_note(FIG6)
    assert "log10 of the bound values themselves" in note and "framed panel (ViT (JaSMin k=10 lam=1e-2 mean)" in note
    assert "No model of this table" in fig6_note(None)


@pytest.fixture
def finished(monkeypatch):
    """The (stem, heading, title, note) of every plotting.finish call, figures closed unsaved."""
    import matplotlib.pyplot as plt

    from harness import plotting

    calls = []

    def record(fig, outdir, stem, ref, title="", note="", **kw):
        calls.append((stem, ref, title, note))
        plt.close(fig)
        return []

    monkeypatch.setattr(plotting, "finish", record)
    return calls


def _committed(name: str) -> pd.DataFrame:
    path = REPO_ROOT / "results" / name / "table.parquet"
    if not path.is_file():
        pytest.skip("no committed table")
    from harness import catalog
    from harness.run import discovery

    discovery.load_all()
    return pd.read_parquet(path)


def test_vs_n_figure_is_an_extension_and_names_every_coinciding_pair(finished, tmp_path):
    from experiments.leaderboard.figures.board import leaderboard_figures

    leaderboard_figures(_committed("bound_leaderboard"), tmp_path)
    (_, ref0, title0, note0), (_, ref1, _, note1) = finished
    assert "framed panel 'ViT (JaSMin k=10 lam=1e-2 mean), per head'" in title0 and "Table 1" not in note0
    assert ref1.startswith("Extends JaSMin") and "no n axis" in ref1
    # MiniLM: LoFAST sharpened / refined up to 4.3 % apart, JaSMin exact / g_1 ~6 % apart; GPT-2: identical pairs
    assert "MiniLM-L6: JaSMin Thm 3 (exact) = JaSMin Thm 3 (g_1)" in note1
    assert "LoFAST eps->0 (sharpened, c=1/2) = LoFAST eps->0 (refined softmax c) (at most 4.3 % apart)" in note1
    assert "GPT-2 (random weights) at n = 64: Castin" in note1


def _sweep(steps: int) -> pd.DataFrame:
    rows = [dict(attack="clean", norm="", eps=0.0, eps_255=0.0, steps=None), *[
        dict(attack=a, norm="linf", eps=e / 255, eps_255=float(e), steps=s)
        for a, s in (("fgsm", 1), ("pgd", steps)) for e in (2, 4, 8)],
        dict(attack="pgd", norm="l2", eps=0.5, eps_255=float("nan"), steps=steps),
        dict(attack="autoattack", norm="linf", eps=2 / 255, eps_255=2.0, steps=10)]
    return pd.DataFrame([dict(r, method=m, accuracy=50.0, n_images=100, train_seed=0, dataset="fashion_mnist",
                              experiment="jasmin_sweep") for m in ("Baseline", "JaSMin k=10 lam=1e-2 mean")
                         for r in rows])


def test_accuracy_figure_splits_the_paper_columns_and_names_the_pgd_steps(finished, tmp_path):
    from experiments.jasmin.figures.accuracy import accuracy_figure, steps_note
    from experiments.jasmin.figures.sweep_report import acc_table

    t = _sweep(10)
    accuracy_figure(t, acc_table(t), tmp_path)
    (_, head, _, note), = finished
    assert "(left of the dashed line; right of it: beyond the paper)" in head and "Reproduces" not in head
    assert ("right of it, ours beyond them: FGSM l_inf 8/255, PGD l_inf 8/255, PGD l2 0.5." in note
            and "PGD here: 10 steps, the paper's tables: 4 steps" in note)
    assert "PGD here: 4 steps, as in the paper." in steps_note(_sweep(4), ["clean"], [])


def test_jacobian_norm_figure_names_fig4_data_cifar100_only(finished, tmp_path):
    from experiments.jasmin.figures.sweep import jacobian_norm_figure

    jacobian_norm_figure(_committed("jasmin_jacobian_norm"), tmp_path)
    (_, _, _, note), = finished
    assert "Paper: ViT-B fine-tuned on CIFAR-100 (Fig. 4: CIFAR-100 only)" in note
    assert "CIFAR-10 / CIFAR-100" not in note
    assert "Fashion-MNIST (CIFAR-10 planned, unreachable" in note
