"""Presentation of castin_sqrt_n_block: the true ||J|| of BERT's post-LN attention block vs the authors' estimator
(imported only inside figures()/summary(), so editing it re-renders without recomputing)."""
from __future__ import annotations

from harness import plotting

from experiments.castin.figures.common import log_n_ticks
from experiments.figures.fits import fmt_fit, loglog_fit

SERIES = [("lipschitz_block", "||J|| of LN(X + attn X) (true)", "lipschitz", "-"),
          ("paper_estimator", "authors' estimator sqrt(||J^T F(X)||)", "paper", "-"),
          ("lipschitz_attention", "||J|| of attn alone (castin_sqrt_n's map)", "castin", "--")]
INPUTS = {"text": "{corpus} text (real layer inputs)", "random_tokens": "random tokens, fixed norm R"}


def _name(g) -> str:
    from experiments.figures.common import model_name

    return model_name(g["model"].iloc[0], bool(g["pretrained"].iloc[0]))


def block_figure(table, outdir):
    """One panel per (model, layer, inputs): medians over sequences vs n, log-log, fitted slopes in the title."""
    groups = list(table.groupby(["model", "layer", "inputs"], sort=False))
    fig, axes = plotting.grid(len(groups), max_cols=4)
    for ax, ((model, layer, inputs), g) in zip(axes, groups):
        med = g.groupby("n").median(numeric_only=True)
        for col, label, key, ls in SERIES:
            ax.scatter(g["n"], g[col], s=3, color=plotting.color(key), alpha=0.35)
            plotting.loglog(ax, med.index, med[col], label, key=key, linestyle=ls, markersize=2)
        ft, fp = loglog_fit(g["n"], g["lipschitz_block"]), loglog_fit(g["n"], g["paper_estimator"])
        what = INPUTS.get(inputs, inputs).format(corpus=g["corpus"].iloc[0])
        if inputs == "random_tokens" and "radius_mean" in g:
            what = what.replace("fixed norm R", f"fixed norm R = {g['radius_mean'].median():.1f}")
        est = (f", estimator {fp['slope']:.2f}" if bool(g["pretrained"].astype(bool).all())
               else "\nestimator: noise (J^T F = 0)")
        plotting.caption(ax, f"{_name(g)}, L{layer}\n{what}\nslope: true {ft['slope']:.2f}{est}")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel("local Lipschitz constant (log)")
        log_n_ticks(ax)
    from experiments.figures.common import setting_note

    note = ("Lines: median over the sequences of each n (dots: each sequence). Map: Hugging Face BertAttention, LN(X + attn(X)) with W^O, biases, residual and LayerNorm (as the "
            "authors measured); the paper finds ~n^0.25. " + setting_note(table))
    if not table["pretrained"].astype(bool).all():
        note += (" With random weights LayerNorm has weight 1 and bias 0, so J^T F(X) = 0 and the estimator is "
                 "rounding noise (~1e-5).")
    return plotting.finish(fig, outdir, "castin_sqrt_n_block", "Castin et al. 2024, Fig. 1 (real data)",
                           title="True ||J|| vs the authors' estimator on the post-LN block", note=note)


def block_summary(table) -> str:
    """Slopes of the true constant and of the estimator beside the paper's ~0.25, and a verdict."""
    out = ["**Post-LN block LN(X + attn(X))** (the authors' real-data map). Slope of log value vs log n over all "
           "sequences (95 % CI). Paper (pretrained BERT-base, their estimator): ~0.25 (n^{1/4}).", "",
           "| model | layer | inputs | n | slope true ‖J‖ | slope authors' estimator | slope attn alone | "
           "slope ‖F(X)‖_F | median estimator / true | converged |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (model, layer, inputs), g in table.groupby(["model", "layer", "inputs"], sort=False):
        fit = lambda c: fmt_fit(loglog_fit(g["n"], g[c]))
        out.append(f"| {_name(g)} | {layer} | {inputs} | {g['n'].min()}-{g['n'].max()} | {fit('lipschitz_block')} | "
                   f"{fit('paper_estimator')} | {fit('lipschitz_attention')} | {fit('output_fro')} | "
                   f"{(g['paper_estimator'] / g['lipschitz_block']).median():.2g} | "
                   f"{int(g['converged'].sum())}/{len(g)} |")
    if not table["pretrained"].all():
        out += ["", "Random weights: HF initializes LayerNorm with weight 1 and bias 0, so every output token has "
                    "the same norm and J^T F(X) = 0 exactly; the authors' estimator is rounding noise there "
                    "(column 'median estimator / true'), and its slope means nothing."]
    if (table["inputs"] == "random_tokens").any():
        out += ["", "Random tokens of a fixed norm: as n grows their attention rows flatten towards uniform, so the "
                    "attention layer alone tends to mean pooling, whose Jacobian norm is ||sum_l W_V,l W_O,l||, "
                    "whatever n (the flat tail of 'slope attn alone'); at small n the rows are peaked and the softmax "
                    "term adds to it, hence the drop over the first tens of tokens (docs/notes/castin-exp.md: "
                    "pretrained MiniLM layer 5 settles at 2.9, and ||sum_l W_V,l W_O,l|| = 2.89 there)."]
    out += ["", block_verdict(table)]
    return "\n".join(out)


PAPER_SLOPE, SLOPE_TOL = 0.25, 0.1  # the paper's ~n^0.25; a true slope within 0.1 of it counts as reproduced


def block_verdict(table) -> str:
    """The paper's claim (the post-LN block's constant grows ~n^0.25 on real text, pretrained BERT-base, measured
    with the authors' estimator) decided on the true constant of each pretrained text panel; the estimator's slope
    beside it says how much of the published growth is the estimator's, and fixed-norm random tokens (inputs the
    paper did not use) are kept apart as a check of the estimator alone."""
    pre = table[table["pretrained"].astype(bool)]
    text = pre[pre["inputs"] == "text"]
    if not len(text):
        return ("Verdict (Fig. 1, real data: the post-LN block's constant grows ~n^0.25 on text): **not determined** "
                "(no pretrained model on text in this run; with random weights the estimator is rounding noise).")
    panels = []
    for (model, layer), g in text.groupby(["model", "layer"], sort=False):
        st, se = (loglog_fit(g["n"], g[c])["slope"] for c in ("lipschitz_block", "paper_estimator"))
        panels.append((f"{_name(g)} layer {layer}", st, se))
    near = [p for p in panels if abs(p[1] - PAPER_SLOPE) <= SLOPE_TOL]
    word = "reproduced" if len(near) == len(panels) else "partly reproduced" if near else "not reproduced"
    each = "; ".join(f"{name}: true {st:.2f}, estimator {se:.2f}" for name, st, se in panels)
    models = ", ".join(dict.fromkeys(_name(g) for _, g in text.groupby("model")))
    over = [f"{name} by {se - st:.2f}" for name, st, se in panels if se - st > 0.05]
    real = [f"{name} ({st:.2f})" for name, st, _ in panels if st > 0.05]
    out = (f"Verdict (Fig. 1, real data: the post-LN block LN(X + attn(X))'s constant grows ~n^0.25 on text; scope: "
           f"the layer as the authors measured it, Alice text; stand-in: {models} pretrained for the paper's "
           f"pretrained BERT-base, whose weights did not run here): **{word}**: the true slope is within "
           f"{SLOPE_TOL:g} of {PAPER_SLOPE:g} in {len(near)} of {len(panels)} panels ({each}). The authors' "
           f"estimator over-states the slope in {len(over)} of {len(panels)} panels ({', '.join(over) or 'none'}); "
           f"the growth that remains is real in {', '.join(real) or 'no panel'}.")
    rnd = pre[pre["inputs"] == "random_tokens"]
    if len(rnd):
        st, se = (loglog_fit(rnd["n"], rnd[c])["slope"] for c in ("lipschitz_block", "paper_estimator"))
        out += (f" On fixed-norm random tokens (not the paper's inputs; pretrained panels pooled) the true constant "
                f"has slope {st:.2f} and the estimator {se:.2f}: there the estimator's growth is "
                + ("mostly an artifact (LayerNorm fixes ||F(X)||_F ~ sqrt(n), and the estimator grows with it)."
                   if se - st > SLOPE_TOL else "close to the true constant's."))
    return out
