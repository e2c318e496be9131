"""Presentation of castin_sqrt_n's random-init Llama panels (RoPE, grouped-query attention): panel labels, the
substitute note of the figure, and the Llama-beside-GPT-2 slope table of the summary. Rows of those panels carry
rope = True, heads, kv_heads, d and tokenizer (experiments/castin/llama.py).
"""
from __future__ import annotations


def is_rope(g) -> bool:
    return "rope" in g.columns and bool(g["rope"].fillna(False).astype(bool).any())


def rope_label(g) -> str:
    """'RoPE, GQA 12 q / 4 kv heads' for a Llama panel, '' otherwise."""
    return f"RoPE, GQA {int(g['heads'].iloc[0])} q / {int(g['kv_heads'].iloc[0])} kv heads" if is_rope(g) else ""


def llama_note(table) -> str:
    """The Llama substitute, stated where its panels are present."""
    if not is_rope(table):
        return ""
    g = table[table["rope"].fillna(False).astype(bool)]
    tok = g["tokenizer"].iloc[0]
    windows = ", the GPT-2 panels' token windows" if tok == "gpt2" else ""
    return (f" Llama: random-init Llama architecture (no pretrained Llama offline; d = {int(g['d'].iloc[0])}, "
            f"{rope_label(g)}, {tok} tokenizer{windows}); "
            "Thm 3.3 is not proven under RoPE, so no bound is drawn there.")


DIFFERS_LLAMA = """- *Llama* (not in the paper): a random-init Llama (RoPE, grouped-query attention, causal, RMSNorm pre-norm);
  no pretrained Llama offline. llama-gqa is GPT-2-small-like (d = 768, 12 query / 4 key-value heads) and reads the
  GPT-2 panels' token windows (GPT-2 tokenizer). The map is the attention sublayer at fixed positions 0..n-1
  (rotary terms in the scores, key/value heads shared); Thm 3.3 is not proven there (n/a)."""


def llama_vs_gpt2(table) -> str:
    """The true constant's fitted slope of each random-init Llama panel beside GPT-2's at the same layer and
    corpus (the same token windows): '' without Llama panels."""
    if not is_rope(table):
        return ""
    from experiments.figures.fits import fmt_fit, loglog_fit

    out = ["\n\n**Llama (RoPE, GQA) beside GPT-2** (both random init, causal; slope of the true ||Df(X)|| vs n, "
           "95 % CI)\n", "| layer | corpus | n | slope Llama | slope GPT-2 |", "|---|---|---|---|---|"]
    rope = table["rope"].fillna(False).astype(bool)
    for (layer, corpus), g in table[rope].groupby(["layer", "corpus"], sort=False):
        gp = table[(table["model"] == "gpt2") & (table["layer"] == layer) & (table["corpus"] == corpus)]
        out.append(f"| {layer} | {corpus} | {g['n'].min()}-{g['n'].max()} | "
                   f"{fmt_fit(loglog_fit(g['n'], g['lipschitz']))} | "
                   f"{fmt_fit(loglog_fit(gp['n'], gp['lipschitz'])) if len(gp) else 'not in this run'} |")
    return "\n".join(out)
