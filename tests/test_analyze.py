"""attnlip analyze / harness.analyze: adapters for every architecture (tiny random checkpoints saved with
save_pretrained), truth vs a dense jacrev Jacobian, soundness of every built-in upper bound, padding masks,
plug-in bounds (an unsound one fails the command), datasets, images, the documented snippet."""
from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from harness.analyze import analyze, cli, core, inputs  # noqa: E402
from harness.bounds import registry  # noqa: E402
from harness.kernels.attention import attention, attention_unchecked  # noqa: E402
from harness.models import text as text_models  # noqa: E402
from harness.models.adapters import UnsupportedModel, adapter_for, lengths  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64)
CONFIGS = {
    "bert": lambda T: T.BertConfig(**SMALL),
    "roberta": lambda T: T.RobertaConfig(**{**SMALL, "max_position_embeddings": 70}, pad_token_id=0),
    "electra": lambda T: T.ElectraConfig(**SMALL, embedding_size=16),
    "distilbert": lambda T: T.DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                               max_position_embeddings=64),
    "albert": lambda T: T.AlbertConfig(**{**SMALL, "num_hidden_layers": 3}, embedding_size=16, num_hidden_groups=1),
    "gpt2": lambda T: T.GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                   pad_token_id=0),
}
TEXTS = ["The cat sat on the mat.", "A much longer sentence about dogs, cats and a very curious rabbit."]


def _bert_tokenizer():
    try:
        return text_models.bert_tokenizer()
    except Exception as e:  # the MiniLM package ships the tokenizer
        pytest.skip(f"BERT tokenizer unavailable: {e}")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{arch: folder} of tiny random-weight checkpoints (weights scaled up so attention is not uniform)."""
    from transformers import AutoModel

    tok = _bert_tokenizer()
    out = {}
    for arch, cfg in CONFIGS.items():
        torch.manual_seed(0)
        m = AutoModel.from_config(cfg(transformers), attn_implementation="eager")
        with torch.no_grad():
            for name, p in m.named_parameters():
                if p.dim() == 2 and "embed" not in name and "wte" not in name and "wpe" not in name:
                    p.mul_(8.0)
        d = tmp_path_factory.mktemp(arch)
        m.save_pretrained(d)
        tok.save_pretrained(d)
        out[arch] = str(d)
    torch.manual_seed(0)
    vit = transformers.ViTModel(transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                       intermediate_size=64, image_size=16, patch_size=8),
                                add_pooling_layer=False)
    d = tmp_path_factory.mktemp("vit")
    vit.save_pretrained(d)
    out["vit"] = str(d)
    return out


def _load(folder):
    model, tok, _ = inputs.load_model(folder)
    return model, tok


# ---- adapters -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_adapter_reproduces_the_model_on_a_padded_batch(saved, arch):
    model, tok = _load(saved[arch])
    ad = adapter_for(model)
    assert ad.causal == (arch == "gpt2")
    enc = inputs.tokenize(tok, TEXTS, None)
    got = ad.capture(enc, range(ad.n_layers), outputs=True)
    lens = lengths(enc["attention_mask"], 2, enc["input_ids"].shape[1])
    assert lens[0] < lens[1]
    for l in range(ad.n_layers):
        w = ad.layer_weights(l)
        X, F = got["inputs"][l].double(), got["outputs"][l].double()
        for b, n in enumerate(lens):  # the real tokens of each padded row: the model's own map
            torch.testing.assert_close(attention(X[b, :n], w, causal=ad.causal), F[b, :n], rtol=1e-4, atol=1e-5)


def test_albert_shares_one_layer_across_applications(saved):
    model, tok = _load(saved["albert"])
    ad = adapter_for(model)
    assert ad.n_layers == 3
    w0, w2 = ad.layer_weights(0), ad.layer_weights(2)
    assert torch.equal(w0.wq, w2.wq)
    X = ad.capture(inputs.tokenize(tok, TEXTS[:1], None), [0, 2])["inputs"]
    assert not torch.allclose(X[0], X[2])


def test_multihead_attention_module_and_unsupported_model():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(16, 4, batch_first=True)

        def forward(self, x):
            n = x.shape[1]
            return self.mha(x, x, x, attn_mask=torch.ones(n, n, dtype=torch.bool).triu(1))[0]

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 6, 16)
    ad = adapter_for(net)
    got = ad.capture((x,), [0], outputs=True)
    assert ad.causal
    torch.testing.assert_close(attention(got["inputs"][0].double(), ad.layer_weights(0), causal=True),
                               got["outputs"][0].double(), rtol=1e-4, atol=1e-5)
    df = analyze(net, (x,), eps=0.0)
    assert df.attrs["causal"] and df["sound"].all()
    class Enc(torch.nn.Module):  # key_padding_mask: the padded batch gives each sequence's own values
        def __init__(self):
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(16, 4)

        def forward(self, x, pad=None):
            return self.mha(x, x, x, key_padding_mask=pad)[0]

    enc = Enc().eval()
    xs = torch.randn(6, 2, 16)  # (n, B, d), batch_first=False
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, 4:] = True
    both = analyze(enc, (xs, pad), eps=0.0)
    alone = analyze(enc, (xs[:4, :1],), eps=0.0)
    assert set(both[both["input"] == 0]["n_tokens"]) == {4}
    np.testing.assert_allclose(both[both["input"] == 0]["value"].values, alone["value"].values, rtol=1e-6)
    with pytest.raises(UnsupportedModel, match="supported: .*BERT.*register_adapter"):
        analyze(torch.nn.Linear(3, 3), torch.randn(2, 3))


# ---- the truth and the bounds ------------------------------------------------------------------------------------
def _dense_norms(X, w, causal):
    """(||J_F||, [||J_{f_l}||]) from dense jacrev Jacobians."""
    n, d = X.shape
    J = torch.func.jacrev(lambda Z: attention_unchecked(Z, w, causal=causal))(X).reshape(n * d, n * d)
    heads = []
    for l in range(w.h):
        wl = w.head(l)
        Jl = torch.func.jacrev(lambda Z: attention_unchecked(Z, wl, causal=causal))(X).reshape(n * d, n * d)
        heads.append(torch.linalg.matrix_norm(Jl, 2))
    return torch.linalg.matrix_norm(J, 2), torch.stack(heads)


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_truth_matches_dense_jacobian_and_upper_bounds_hold(saved, arch):
    model, tok = _load(saved[arch])
    df = analyze(model, TEXTS[:1], tokenizer=tok, layers=[1])
    ad = adapter_for(model)
    X = ad.capture(inputs.tokenize(tok, TEXTS[:1], None), [1])["inputs"][1][0].double()
    J, Jh = _dense_norms(X, ad.layer_weights(1), ad.causal)
    t = df[df["method"] == "truth"].set_index("head")["value"]
    assert t[-1] == pytest.approx(float(J), rel=1e-5)
    np.testing.assert_allclose(t.loc[range(4)].values, Jh.numpy(), rtol=1e-5)
    ups = df[(df["kind"] == "upper") & (df["bounds"] == "local") & df["guaranteed"]]
    assert set(registry.bound_names("upper", what=registry.LOCAL)) - {"kim"} <= set(ups["method"])
    assert (ups["value"] >= ups["truth"] * (1 - 1e-6)).all()
    assert df["sound"].all()
    assert df.attrs["causal"] == (arch == "gpt2")


def test_methods_subset_and_callable_module(saved):
    import harness
    import harness.analyze  # noqa: F401 - the module itself is callable

    model, tok = _load(saved["bert"])
    df = harness.analyze(model, TEXTS[0], tokenizer=tok, layers=[-1], methods=["lofast_sharp", "pgd"])
    assert set(df["method"]) == {"truth", "truth_upper", "lofast_sharp", "pgd"}
    assert set(df["layer"]) == {1} and df["sound"].all()


def test_padded_batch_equals_each_text_alone(saved):
    model, tok = _load(saved["bert"])
    both = analyze(model, TEXTS, tokenizer=tok, eps=0.0)
    for i, t in enumerate(TEXTS):
        alone = analyze(model, [t], tokenizer=tok, eps=0.0)
        b = both[both["input"] == i].reset_index(drop=True)
        assert len(b) == len(alone)
        assert (b["n_tokens"] == alone["n_tokens"]).all()
        np.testing.assert_allclose(b["value"].values, alone["value"].values, rtol=1e-4)


# ---- plug-in bounds ---------------------------------------------------------------------------------------------
@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_bounds.py").write_text(textwrap.dedent("""
        import torch

        def too_small(X, w, causal=False):
            '''Deliberately unsound: 1e-9 per head.'''
            return torch.full((*X.shape[:-2], w.h), 1e-9, dtype=X.dtype)

        def generous(X, w):
            '''Sound: sum_l ||VO_l|| (||P|| + 2 ||X||^2 ||A_l||) (JaSMin Thm 3 with ||J_sm|| <= 1).'''
            from harness.kernels.attention import probs
            P = torch.linalg.matrix_norm(probs(X, w), 2)
            x2 = torch.linalg.matrix_norm(X, 2)[..., None] ** 2
            return 10 * w.VO_norm() * (P + 2 * x2 * w.A_norm())

        def layer_total(X, w):
            return generous(X, w).sum(-1)

        layer_total.scope = "layer"
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_bounds"
    for name in ("too_small", "generous", "layer_total"):
        if name in registry.bound_names():
            registry.unregister_bound(name)
    sys.modules.pop("my_bounds", None)


def test_unsound_plugin_fails_the_command(saved, plugin_module, tmp_path):
    out = tmp_path / "out"
    rc = cli.main(["analyze", "--model", saved["bert"], "--text", TEXTS[0], "--text", TEXTS[1], "--eps", "0",
                   "--bound", f"{plugin_module}:too_small", "--bound", f"{plugin_module}:generous",
                   "--bound", f"{plugin_module}:layer_total",
                   "--out", str(out), "--no-progress"])
    assert rc == 1
    import pandas as pd

    df = pd.read_parquet(out / "table.parquet")
    for c in ("layer", "head", "method", "kind", "value", "truth", "ratio", "converged", "sound"):
        assert c in df.columns
    bad = df[df["method"] == "too_small"]
    assert len(bad) and not bad["sound"].any() and bad["user"].all()
    assert df[df["method"] == "generous"]["sound"].all()
    lt = df[df["method"] == "layer_total"]
    assert len(lt) and (lt["head"] == -1).all() and lt["sound"].all()
    assert df[~df["user"]]["sound"].all()
    summary = (out / "summary.md").read_text()
    assert "UNSOUND: too_small" in summary and "generous" not in summary.split("## Tightness")[0]
    rep = json.loads((out / "report.json").read_text())
    assert rep["sound"] is False and rep["unsound_methods"] == ["too_small"]
    for f in ("table.csv", "heatmap.png", "layers.png", "distribution.csv"):
        assert (out / f).stat().st_size > 0


def test_sound_run_exits_zero_and_entry_points_register(saved, plugin_module, monkeypatch, capsys, tmp_path):
    import importlib.metadata as md

    mod = __import__(plugin_module)

    class EP:
        def load(self):
            return [mod.generous]

    monkeypatch.setattr(md, "entry_points", lambda group=None: [EP()] if group == core.ENTRY_POINT_GROUP else [])
    out = tmp_path / "ep"
    # BERT: `generous` cannot see a causal mask, so it is declared for unmasked layers only
    rc = cli.main(["--model", saved["bert"], "--text", TEXTS[0], "--layers", "0", "--no-progress", "--out", str(out)])
    assert rc == 0
    import pandas as pd

    assert "generous" in set(pd.read_parquet(out / "table.parquet")["method"])  # the entry point was evaluated
    assert "generous" not in registry.bound_names()  # and unregistered after the command: nothing leaks in-process
    assert "truth" in capsys.readouterr().out


# ---- inputs ------------------------------------------------------------------------------------------------------
def test_dataset_files(tmp_path):
    f = tmp_path / "mine.csv"
    f.write_text("id,text\n1,hello world\n2,second text here\n")
    assert sorted(inputs.load_dataset_texts(str(f), 5)) == ["hello world", "second text here"]


def test_shipped_datasets_offline(shared_data):
    sst = inputs.load_dataset_texts("sst2:validation", 3)
    assert len(sst) == 3 and all(isinstance(t, str) and t for t in sst)
    assert len(inputs.load_dataset_texts("ag_news", 2)) == 2


def test_a_missing_shipped_dataset_is_named(monkeypatch):
    from harness.data import text as corpora
    from harness.errors import DataNotFound

    def missing(name, split=None):
        raise DataNotFound(f"dataset {name!r} is not available: no mirror, no cached copy",
                           fix=f"attnlip data fetch {name}")

    monkeypatch.setattr(corpora, "load_corpus", missing)
    with pytest.raises(DataNotFound) as got:
        inputs.load_dataset_texts("sst2:validation", 3)
    assert str(got.value).startswith("--dataset sst2:validation reads GLUE SST-2, which is not available here")
    assert got.value.fix == "attnlip data fetch sst2"
    with pytest.raises(ValueError, match="splits"):
        inputs.load_dataset_texts("sst2:test", 3)  # SST-2's test split has no labels and is not shipped


def test_vit_from_images_and_npy(saved, tmp_path):
    from PIL import Image

    img_dir = tmp_path / "imgs"
    img_dir.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(img_dir / f"{i}.png")
    rc = cli.main(["--model", saved["vit"], "--images", str(img_dir), "--out", str(tmp_path / "o"), "--no-progress"])
    assert rc == 0
    np.save(tmp_path / "b.npy", rng.random((2, 16, 16, 3)).astype(np.float32))
    px = inputs.load_images(str(tmp_path / "b.npy"), 16)
    assert px.shape == (2, 3, 16, 16)
    df = analyze(saved["vit"], px, eps=0.0)
    assert df["n_tokens"].iloc[0] == 5 and df["sound"].all()


def test_doc_snippet_runs():
    """The snippet of docs/notes/analyze.md (copied into the README) runs as written."""
    md = (REPO / "docs" / "notes" / "analyze.md").read_text()
    code = re.search(r"```python\n(.*?)```", md, re.S).group(1)
    ns = {}
    exec(compile(code, "analyze.md", "exec"), ns)
    assert ns["df"]["sound"].all()


def test_float32_agrees_with_float64(saved):
    model, tok = _load(saved["distilbert"])
    a = analyze(model, TEXTS, tokenizer=tok, eps=0.0, dtype="float64")
    b = analyze(model, TEXTS, tokenizer=tok, eps=0.0, dtype="float32")
    assert list(a["method"]) == list(b["method"]) and b.attrs["dtype"] == "float32"
    up = (a["method"] == "truth_upper").values  # certified upper estimates: a KW estimate above the value
    assert np.isclose(b["value"].values, a["value"].values, rtol=np.where(up, 6e-3, 2e-3), atol=0).all()


def test_analyze_truth_is_the_registrys_truth_with_a_certificate():
    from harness.bounds.input_state import InputState
    from harness.kernels import layer as L
    from harness.kernels.attention import AttentionWeights
    from harness.kernels.linalg import spec

    g = torch.Generator().manual_seed(3)
    w = AttentionWeights.random(16, 4, scale=1.5, dtype=torch.float64, generator=g, bias=True)
    X = torch.randn(2, 24, 16, dtype=torch.float64, generator=g)
    a, s = core.AnalyzeState(X, w, seed=5, certify_steps=26), InputState(X, w)
    cert = dict(steps=26, fail_prob=1e-6)
    for heads, got in ((True, a.truth_head), (False, a.truth_layer)):
        ref = L.truth(X, w, heads=heads, seed=5, certify=cert)
        assert torch.equal(got, ref.value) and torch.equal(a.upper["head" if heads else "layer"], ref.upper)
    assert torch.allclose(s.truth_head, a.truth_head, rtol=1e-6) and torch.allclose(s.truth_layer, a.truth_layer,
                                                                                      rtol=1e-6)
    assert s.upper == {} and set(core.truth_uppers(a)) == {("truth_upper", "head"), ("truth_upper", "layer")}
    assert torch.allclose(s.P_norm, spec(s.P), rtol=1e-13)


def test_images_that_are_not_an_image_batch_are_one_line(saved, tmp_path, capsys):
    import numpy as np

    bad = {"flat.npy": np.zeros(7, dtype=np.float32), "empty.npy": np.zeros((0, 16, 16, 3), dtype=np.float32),
           "nan.npy": np.full((1, 16, 16, 3), np.nan, dtype=np.float32)}
    for name, arr in bad.items():
        np.save(tmp_path / name, arr)
    (tmp_path / "pngs").mkdir()
    (tmp_path / "pngs" / "broken.png").write_bytes(b"not a png")
    for target in [*(tmp_path / n for n in bad), tmp_path / "pngs"]:
        rc = cli.main(["--model", saved["vit"], "--images", str(target), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and "--images" in err and "Traceback" not in err, (target, err)


def test_report_figures_keep_series_and_ticks_apart(tmp_path):
    """Colour-bar labels differ from their neighbours even on a narrow range; a layer series equal to another is
    found (and labelled so in layers.png); every series gets its own style."""
    import pandas as pd

    from harness.analyze import report

    labels = report._distinct_labels([1.0801, 1.0852, 1.0899, 1.0951])
    assert len(set(labels)) == 4
    a = pd.Series([3.0, 2.0], index=[0, 1])
    assert report._coincident({"second_order": a, "best": a.copy(), "fine": a * 2}) == {"best": ("second_order", 0.0)}
    near = report._coincident({"truth": a / a, "kw": a / a * 1.09, "far": a / a * 1.5})
    assert set(near) == {"kw"} and near["kw"][0] == "truth" and abs(near["kw"][1] - 0.09) < 1e-12
    styles = report._styles(25)
    assert len({(s["color"], s["marker"], s["ls"]) for s in styles}) == 25
    rows = [dict(input=0, layer=l, head=-1, scope="layer", method=m, kind=k, bounds=b, ratio=r, value=r, truth=1.0,
                 n_tokens=4, sound=True, note="")
            for l in (0, 1) for m, k, b, r in (
                ("truth", "exact", "local", 1.0), ("castin", "upper", "local", 50.0),
                ("second_order", "upper", "eps-ball", 1.2), ("best", "upper", "eps-ball", 1.2),
                ("pgd", "lower", "eps-ball", 0.9))]
    df = pd.DataFrame(rows)
    df.attrs["eps"] = 0.01
    report.layer_plot(df, tmp_path / "layers.png")
    assert (tmp_path / "layers.png").stat().st_size > 0

