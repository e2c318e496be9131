"""LoFAST Fig. 5 / App. C.3: certified accuracy on SST-2 under l2 perturbations of the word embeddings.

Same certifiable blocks as the ViT (LayerProject, SLL, ||W^V||, ||W^O|| fraction), d = 64, 32 tokens
([CLS] ... [SEP] padded, BERT WordPiece ids from the MiniLM tokenizer, embeddings initialized from MiniLM's word
embeddings (PCA to d = 64) and fine-tuned, rows normalized to norm 1 and scaled by embed_scale = 0.25 into the
trunk, so L_in = 0.25), trained on a subset of the GLUE SST-2 train split, certified on the dev split. No
attention mask (padding tokens are attended to and may be perturbed, which keeps eq. (3) exact). Certificates
are float64 whatever the run's dtype (column certificate_dtype). `--bound` plug-ins of kind ball_change certify
beside the paper's, as in lofast_certified.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from experiments.lofast import grids
from harness.models import lofast_eval
from harness.catalog import Experiment, experiment
from harness.store.artifacts import cached_artifact

EPS_REF = 0.1  # the summary's reference radius


@experiment
class LofastText(Experiment):
    name = "lofast_text"
    figures_ref = ["LoFAST (Havens et al.) Fig. 5 (App. C.3)"]
    description = "Certified accuracy on SST-2 with l2 perturbations of word embeddings"
    # the paper's grid is layers {3, 6} x heads {4, 8} x norms {0.25, 0.5, 0.75} (12 models); shrunk to the CPU budget
    grid = {"layers": [3, 3, 3, 6], "heads": [4, 4, 4, 8], "vo_norm": [0.25, 0.5, 0.75, 0.5],
            **grids.TEXT_FULL, "points": [200], "pgd_steps": [15], "pgd_restarts": [2],
            "eps": [[0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0]]}
    paired = [("layers", "heads", "vo_norm")]
    quick = {"layers": [3], "heads": [4], "vo_norm": [0.5], **grids.TEXT_QUICK, "points": [48], "pgd_restarts": [1]}
    test = {"layers": [1], "heads": [4], "vo_norm": [0.5], **grids.TEXT_TEST, "points": [12], "pgd_steps": [8],
            "pgd_restarts": [1]}
    # --bound module:function with the attributes scope = "layer", bounds = "ball_change" certifies beside these
    accepts_bounds = True
    # SST-2 is the paper's own data set: no substitute (a cell without it fails naming `attnlip data fetch sst2`).
    # --scale paper: the paper's 12 models (layers {3, 6} x heads {4, 8} x norms {0.25, 0.5, 0.75}) on the whole
    # SST-2 train split (67,349 sentences), certified on the whole dev split (872). The paper gives no epoch count:
    # 10 epochs at the full scale's rate is our choice.
    paper = {"layers": [3] * 6 + [6] * 6, "heads": ([4] * 3 + [8] * 3) * 2, "vo_norm": [0.25, 0.5, 0.75] * 4,
             **dict(grids.TEXT_FULL, train_size=[67349], epochs=[10]), "points": [872], "pgd_steps": [15],
             "pgd_restarts": [2], "eps": [[0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0]]}
    paper_cost = 30  # x the full run's cell time: 3x the models, 42x the training steps, 4.4x the points, on a GPU
    float32_exempt = ("pgd_acc", "train_seconds")  # PGD and wall-clock time are chaotic under a dtype change
    verify_tol = {"default": 1e-9, "train_seconds": None}  # timings are not reproducible numbers

    def run(self, cell, ctx) -> List[dict]:
        return lofast_eval.certified_cell("text", cell, ctx, store=cached_artifact)

    def figures(self, table, outdir: Path):
        from experiments.lofast.figures import certified as certified_figures

        return certified_figures.plot_certified(table, outdir, "lofast_text", "radius eps (Frobenius, on the embeddings)",
                                "small BERT-like models on SST", "SST-2, LipText d=64, n=32 tokens (unit-norm token rows)")

    def summary(self, table) -> str:
        from experiments.lofast.figures import certified as certified_figures

        return "\n".join([
            certified_figures.certified_summary(table, EPS_REF), "",
            "Paper: layers {3, 6} x heads {4, 8} x norms {0.25, 0.5, 0.75}; regularity barely costs clean accuracy and "
            "certified radii are comparable to prior l2 work on embeddings. Here the grid is shrunk to the CPU budget "
            "(see `grid`), models train for 1-2 epochs on a subset of SST-2 train and are certified on the first dev "
            "sentences; the embedding table starts from MiniLM's word embeddings (PCA to d = 64) and is fine-tuned; rows "
            "are normalized to norm 1 (the perturbed quantity) and scaled by 0.25 into the trunk, so eps is relative to "
            "unit-norm token embeddings. Beyond the paper: exact ||M_l|| and the softmax constant 1/2 next to xi.",
            "", _verdict(table)])


def _verdict(table) -> str:
    """'Regularity barely costs clean accuracy': the spread of full-test accuracy over the vo_norm levels (the
    regularity knob); certified accuracy must be sound (no PGD violation). Prior l2 work is not in this repository,
    so the radii are reported, not compared."""
    acc = table.groupby("vo_norm")["test_acc_full"].mean()
    viol = int(table.loc[table["violations"] > 0, "violations"].sum()) if "violations" in table else 0
    if len(acc) < 2:
        return "Verdict: **not determined** (one regularity level at this scale)."
    spread = float(acc.max() - acc.min())
    word = "partly reproduced" if spread <= 0.03 and viol == 0 else "not reproduced"
    return (f"Verdict (regularity barely costs clean accuracy; certified radii comparable to prior l2 work on "
            f"embeddings; scope: the whole certified text model; stand-in: our LipText on SST-2 with MiniLM's word "
            f"embeddings, for the paper's models): **{word}**: full-test accuracy {acc.min():.3f} to {acc.max():.3f} over ||W^V W^O|| "
            f"levels {', '.join(f'{v:g}' for v in acc.index)} (spread {100 * spread:.1f} points; 3 or fewer counts "
            f"as barely), {viol} certified points broken by PGD; the comparison with prior l2 work is not made here "
            f"(no such numbers in this repository), hence partly.")
