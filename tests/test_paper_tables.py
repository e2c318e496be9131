"""The paper scale runs the papers' settings: every row of JaSMin's Tables 1-4 in jasmin_sweep's paper grid (each
one the paper's numbers stand beside), and LoFAST Fig. 1's 4 patches in lofast_tightness's."""
from harness import catalog
from harness.run import discovery


def _labels(cells, dataset):
    from experiments.jasmin import common
    from harness.models.regularizers import method_label

    return {method_label(**common.regularizer_args(c)) for c in cells if c["dataset"] == dataset}


def test_jasmin_sweep_paper_grid_runs_every_table_row():
    from experiments.jasmin.figures.sweep_report import PAPER_CIFAR10, PAPER_CIFAR100

    discovery.load_all()
    cells = catalog.get_experiment("jasmin_sweep").cells("paper")
    assert len(PAPER_CIFAR100) == len(PAPER_CIFAR10) == 31  # Tables 3 and 4: 1 + 12 Specformer + 18 JaSMin rows
    assert _labels(cells, "cifar100") == set(PAPER_CIFAR100)
    assert _labels(cells, "cifar10") == set(PAPER_CIFAR10)
    # Table 2's joint Specformer rows at 1e-3 / 1e-4 and JaSMin k = 30 (65 tokens at patch 4) are among them
    table2 = {"Specformer(joint, 1e-3)", "Specformer(joint, 1e-4)", "JaSMin k=30 lam=1e-4 max"}
    assert table2 <= _labels(cells, "cifar10")
    assert {c["patch"] for c in cells} == {4}


def test_paper_tables_hold_the_paper_s_numbers():
    from experiments.jasmin.figures.sweep_report import PAPER_CIFAR10, PAPER_CIFAR100

    # spot checks against the paper's text (Table 3 prints 27.97 as 2797)
    assert PAPER_CIFAR100["Specformer(v, 1e-4)"] == (90.96, 46.92, 40.2, 27.97, 13.03, 2.22)
    assert PAPER_CIFAR10["JaSMin k=10 lam=1e-4 max"] == (98.40, 73.52, 65.92, 42.67, 17.33, 1.69)
    assert all(len(v) == 6 and all(0 <= x <= 100 for x in v) for t in (PAPER_CIFAR100, PAPER_CIFAR10)
               for v in t.values())


def test_lofast_tightness_paper_scale_has_four_patches():
    discovery.load_all()
    cells = catalog.get_experiment("lofast_tightness").cells("paper")
    assert {(c["dataset"], c["patch"]) for c in cells} == {("cifar10", 16)}  # 32 / 16 = 2 x 2 = 4 patches
    cert = {(c["patch"], c["vo_norm"], c["heads"]) for c in catalog.get_experiment("lofast_certified").cells("paper")}
    assert (16, 0.5, 8) in cert  # the study's L2-h8-c0.5 ViT at patch 16 is one lofast_certified trains
