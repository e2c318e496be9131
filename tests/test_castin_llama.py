"""castin_sqrt_n's random-init Llama panels (RoPE, grouped-query attention, causal): the test-scale cell's rows
(finite positive truth, slope in the summary, Thm 3.3 n/a with its reason), its figure, the per-sequence truth
against `attnlip analyze` on the same tokens, the grid declaration and the cell key's model source."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from experiments.castin import llama


def _exp():
    from harness.catalog import get_experiment

    return get_experiment("castin_sqrt_n")


def _llama_cell(scale):
    return next(c for c in _exp().cells(scale) if llama.is_llama(c["model"]))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_llama_cell_at_test_scale(dtype, tmp_path):
    """The tiny Llama test cell: one row per (n, sequence), truth finite and > 0 and converged, the bound n/a
    with the bound registry's RoPE reason, and a summary with the Llama slope row and fit."""
    from harness.catalog import Context

    exp, cell = _exp(), _llama_cell("test")
    assert cell["model"] == "tiny-llama" and cell["masked"] is True
    rows = exp.run(cell, Context(scale="test", dtype=dtype, cache_dir=tmp_path, progress=False))
    assert len(rows) == len(cell["n"]) * cell["count"]
    t = pd.DataFrame([dict(cell, **r) for r in rows])
    assert sorted(t["n"].unique()) == sorted(cell["n"])
    assert t["lipschitz"].map(math.isfinite).all() and (t["lipschitz"] > 0).all() and t["converged"].all()
    assert (t["paper_estimator"] > 0).all()
    assert t["bound_castin"].isna().all() and t["bound_note"].str.contains("rotary").all()
    assert t["causal"].all() and t["rope"].all() and (t["heads"] == 4).all() and (t["kv_heads"] == 2).all()
    text = exp.summary(t.assign(experiment="castin_sqrt_n"))
    assert "**Llama (RoPE, GQA) beside GPT-2**" in text and "n/a (RoPE)" in text
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {cell['layer']} | synthetic |"))
    slope = float(line.split("|")[4].split("[")[0])  # column "slope Llama": slope [lo, hi]
    from experiments.figures.fits import loglog_fit

    assert slope == pytest.approx(loglog_fit(t["n"], t["lipschitz"])["slope"], abs=0.006)


def test_llama_figure_states_the_substitute(tmp_path):
    """The figure renders a labelled Llama panel; its footnote says random init and no pretrained Llama."""
    from experiments.castin.figures.llama import llama_note, rope_label

    rows = [dict(n=n, seq=i, lipschitz=0.1 * n ** 0.3 * (1 + 0.01 * i), paper_estimator=0.2 * n ** 0.5,
                 bound_castin=float("nan"), radius_mean=5.0, converged=True, iters=float("nan"), cpu_s=0.0,
                 causal=True, pretrained=False, d=768, heads=12, kv_heads=4, rope=True, tokenizer="gpt2")
            for n in (2, 4, 8, 16) for i in range(2)]
    t = pd.DataFrame(rows).assign(model="llama-gqa", layer=0, masked=True, corpus="alice",
                                  experiment="castin_sqrt_n")
    assert rope_label(t) == "RoPE, GQA 12 q / 4 kv heads"
    assert "random-init Llama" in llama_note(t) and "no pretrained Llama" in llama_note(t)
    paths = _exp().figures(t, tmp_path)
    assert paths and all(p.exists() and p.stat().st_size > 0 for p in paths)
    assert "| llama-gqa (random) | 0 | causal | alice |" in _exp().summary(t)


def test_truth_equals_analyze_truth():
    """Per sequence, the panel's truth (M.capture + M.measure) equals `attnlip analyze`'s layer truth of the same
    model module on the same token ids (tiny Llama, layer 1, float64)."""
    from harness.analyze.core import analyze

    model, _ = llama.load("tiny-llama", 0, "cpu")
    ids = llama.ids("tiny-llama", "synthetic", 6, 2, chunk_seed=3)
    lay = llama.capture("tiny-llama", ids, [1])[1]
    ours = llama.measure(lay.X, lay.amap, tol=1e-10)["lipschitz"]
    df = analyze(model, {"input_ids": ids}, layers=[1], eps=0.0, tol=1e-10)
    ref = df[(df["scope"] == "layer")].groupby("input")["truth"].first().sort_index()
    assert len(ref) == 2
    assert torch.allclose(ours, torch.tensor(ref.values, dtype=torch.float64), rtol=1e-8, atol=0)


def test_grid_and_cell_key_model_source():
    """Full scale measures GPT-2's layers and corpora with the GPT-2-small-like GQA config; quick and test are
    small; the cell key's model source names the config, tokenizer and init."""
    from harness.run.plan import model_source

    exp = _exp()
    full = [c for c in exp.cells("full") if llama.is_llama(c["model"])]
    gpt2 = [c for c in exp.cells("full") if c["model"] == "gpt2"]
    assert {(c["layer"], c["corpus"]) for c in full} == {(c["layer"], c["corpus"]) for c in gpt2}
    for c in full:
        g = next(g for g in gpt2 if (g["layer"], g["corpus"]) == (c["layer"], c["corpus"]))
        assert c["n"] == g["n"] and c["count"] == g["count"] and c["masked"]
    quick = [c for c in exp.cells("quick") if llama.is_llama(c["model"])]
    assert quick and all(max(c["n"]) <= 32 and c["count"] <= 3 for c in quick)
    src = model_source(exp, full[0])
    assert src.startswith("random-init:llama-gqa(") and all(
        s in src for s in ("d=768", "heads=12", "kv=4", "tokenizer=gpt2"))
    assert model_source(exp, _llama_cell("test")) != src
    assert model_source(exp, gpt2[0]) == "random-init:gpt2(seed=0)"


def test_llama_gqa_reads_the_gpt2_panels_windows(shared_data):
    """llama-gqa tokenizes with GPT-2's tokenizer (vocab_size matched), so its windows are the GPT-2 panels'."""
    from harness.models import text

    a = llama.ids("llama-gqa", "synthetic", 16, 3, chunk_seed=100003 + 16)
    b = text.chunk_ids("gpt2", "synthetic", 16, 3, 100003 + 16)
    assert torch.equal(a, b)
    assert 0 <= int(a.min()) and int(a.max()) < len(text.tokenizer("gpt2"))
