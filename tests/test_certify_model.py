"""`attnlip certify` on whole classifiers: the programs compute the models' own logits, no certified radius exceeds
an attack's, the network route's margin bound holds against an attack, and the command line writes its table,
summary and figure or says clearly what is wrong."""
import math

import pandas as pd
import pytest
import torch

from harness.certify import core, network
from harness.certify.cli import main as certify_main
from harness.certify.programs import patches, program_for
from harness.kernels.pgd import pgd_maximize

transformers = pytest.importorskip("transformers")
D = torch.float64
WORDS = "[PAD] [UNK] [CLS] [SEP] [MASK] a the film movie good bad great awful fun boring is was not very , . !".split()


def _bert(act="gelu", layers=2, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=layers,
                                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
                                  num_labels=2, hidden_act=act, attn_implementation="eager")
    m = transformers.BertForSequenceClassification(cfg).eval()
    with torch.no_grad():  # trained-model-like embedding scale, so one word can change the prediction
        m.bert.embeddings.word_embeddings.weight.mul_(20.0)
        m.classifier.weight.mul_(20.0)
    return m


def _distilbert():
    torch.manual_seed(1)
    cfg = transformers.DistilBertConfig(vocab_size=len(WORDS), dim=16, n_layers=2, n_heads=2, hidden_dim=32,
                                        max_position_embeddings=32, attn_implementation="eager")
    return transformers.DistilBertForSequenceClassification(cfg).eval()


def _vit():
    torch.manual_seed(2)
    cfg = transformers.ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                                 image_size=8, patch_size=4, num_labels=3, attn_implementation="eager")
    return transformers.ViTForImageClassification(cfg).eval()


IDS = [2, 6, 7, 16, 9, 3]  # [CLS] the film was good [SEP]


@pytest.mark.parametrize("make", [_bert, lambda: _bert("relu"), _distilbert])
def test_text_program_computes_the_models_logits(make):
    m = make().to(D)
    p = program_for(m)
    X = m.get_input_embeddings().weight[IDS].detach()
    ref = m(input_ids=torch.tensor([IDS])).logits[0]
    assert torch.allclose(p.forward(X), ref, atol=1e-12, rtol=0)


def test_vit_program_computes_the_models_logits():
    m = _vit().to(D)
    img = torch.randn(3, 8, 8, dtype=D, generator=torch.Generator().manual_seed(0))
    ref = m(pixel_values=img[None]).logits[0]  # Hugging Face's softmax runs in float32: 1e-8 apart
    assert torch.allclose(program_for(m).forward(patches(img, 4)), ref, atol=1e-6, rtol=0)


def _min_margin(p, X, y, r, rows):
    """The smallest margin PGD finds within r (its own steps and seed, not the command's attack)."""
    idx = list(rows) if rows is not None else list(range(X.shape[0]))
    obj = core.margin_objective(p, X, y, idx)
    return -float(pgd_maximize(obj, X[idx][None], torch.tensor([r], dtype=D), steps=60, restarts=4,
                               batch_dims=1, seed=3).value[0])


@pytest.mark.parametrize("rows", [(1,), None])
@pytest.mark.parametrize("make", [_bert, lambda: _bert("relu", seed=3), _distilbert])
def test_no_certified_radius_exceeds_the_attack_and_the_certified_ball_holds(make, rows):
    m = make().to(D)
    p = program_for(m)
    X = m.get_input_embeddings().weight[IDS].detach()
    y = int(p.forward(X).argmax())
    c = core.certify_input(p, X, y, rows)
    assert c.correct and c.radius > 0 and c.route in ("layer by layer", "network")
    core.attack_into(c, p, X, rows)
    assert c.radius <= c.attack_radius and c.sound
    assert _min_margin(p, X, y, c.radius, rows) > 0  # nothing the attack finds inside the certified ball
    names = [b for b, _, _ in c.blocks]
    assert names[0] == "embeddings.LayerNorm" and any(n.endswith("attention") for n in names)


@pytest.mark.parametrize("rows", [None, (2,)])
def test_network_route_margin_bound_holds_and_is_first_order_tight(rows):
    m = _bert().to(D)
    p = program_for(m)
    X = m.get_input_embeddings().weight[IDS].detach()
    y = int(p.forward(X).argmax())
    tr = p.chain.trace(X)
    net = network.prepare_network(p, tr, X, y)
    j = 1 - y
    for r in (1e-4, 1e-2, 0.1):
        low = float(network.margin_lower_bounds(net, tr, r, rows)[j])
        assert low <= _min_margin(p, X, y, r, rows) + 1e-12
    # the exact gradient: the first-order change is reached by the attack on a small ball
    r = 1e-5
    g = float(net.grad_norms(0, rows)[j])
    assert (float(net.margins[j]) - _min_margin(p, X, y, r, rows)) / r == pytest.approx(g, rel=1e-3)
    r = 1e-6  # and the bound's loss tends to it (within its 1e-10 relative rounding allowance on the margin)
    loss = float(net.margins[j]) - float(network.margin_lower_bounds(net, tr, r, rows)[j])
    assert loss == pytest.approx(g * r, rel=0.05)


def test_vit_radius_below_attack():
    m = _vit().to(D)
    p = program_for(m)
    X = patches(torch.randn(3, 8, 8, dtype=D, generator=torch.Generator().manual_seed(1)), 4)
    y = int(p.forward(X).argmax())
    c = core.certify_input(p, X, y, None)
    core.attack_into(c, p, X, None)
    assert 0 < c.radius <= c.attack_radius


@pytest.fixture()
def folder(tmp_path):
    out = tmp_path / "clf"
    out.mkdir()
    (out / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    transformers.BertTokenizer(str(out / "vocab.txt")).save_pretrained(out)
    _bert().save_pretrained(out)
    return out


def test_command_writes_table_summary_and_figure(folder, tmp_path, capsys):
    out = tmp_path / "out"
    rc = certify_main(["--model", str(folder), "--text", "the film was good", "--text", "a very boring movie !",
                       "--out", str(out), "--no-progress", "--threads", "1"])
    assert rc == 0
    df = pd.read_csv(out / "table.csv")
    assert len(df) == 2 and (df["certified_radius"] <= df["attack_radius"]).all() and df["sound"].all()
    assert {"route", "attention_certificates", "perturbation", "seconds", "attack_seconds", "fail_prob"} <= set(df)
    assert "word embedding at token 1" in df["perturbation"][0]
    assert "certified" in (out / "summary.md").read_text() and (out / "radii.png").stat().st_size > 1000
    assert "median certified radius" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["--perturb", "pixels"], "pixels are a ViT's input"),
    (["--samples", "0"], "--samples"),
    (["--methods", "secnd_order"], "not a ball-change certificate"),
    (["--dataset", "ag_news"], "labelled sst2"),
])
def test_command_mistakes_get_one_clear_line(folder, args, needle, capsys):
    argv = ["--model", str(folder), "--no-progress", "--threads", "1", *args]
    if "--dataset" not in args:
        argv += ["--text", "the film was good"]
    assert certify_main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_a_model_without_a_classification_head_is_refused(tmp_path, capsys):
    base = tmp_path / "base"
    _bert().bert.save_pretrained(base)
    assert certify_main(["--model", str(base), "--text", "x", "--no-progress", "--threads", "1"]) == 2
    assert "not a classifier with a trained head" in capsys.readouterr().err
    assert certify_main(["--model", str(tmp_path / "nope"), "--text", "x", "--no-progress"]) == 2


def test_prefix_jacobian_norms_are_the_dense_ones_and_the_refined_balls_hold():
    from harness.certify import tangents

    m = _bert().to(D)
    p = program_for(m)
    X = m.get_input_embeddings().weight[IDS].detach()
    tr = p.chain.trace(X)
    rows = (2,)
    norms = tangents.prefix_norms(tr, rows)
    assert tangents.prefix_norms(tr, None) is None and norms[0] == 1.0 and len(norms) == len(tr.steps) + 1
    blocks = [s.block for s in tr.steps]

    def prefix(k):
        def f(row):  # the input of step k as a function of the moving row
            full = X.clone()
            full[2] = row
            for b in blocks[:k]:
                full = b.forward(full)
            return full
        return f

    for k in (1, 2, 5, len(blocks)):
        J = torch.autograd.functional.jacobian(prefix(k), X[2]).reshape(-1, X.shape[1])
        assert norms[k] == pytest.approx(float(torch.linalg.matrix_norm(J, ord=2)), rel=1e-9)
    eps = 0.002
    b = network.ball_series(tr, eps, rows, norms)[-1]
    assert any(h.endswith("then the exact prefix Jacobian") for h in b.how)  # the refinement is used
    for k in (2, 5, len(blocks)):  # every refined radius is above the change an attack finds
        f = prefix(k)
        Y = f(X[2])

        def obj(V):
            return torch.stack([torch.linalg.vector_norm(f(v[0]) - Y) for v in V])

        found = float(pgd_maximize(obj, X[2][None, None], torch.tensor([eps], dtype=D), steps=30, restarts=3,
                                   batch_dims=1, seed=4).value[0])
        assert found <= b.radii[k] * (1 + 1e-9)


def test_command_certifies_a_vit_on_pixels(tmp_path, capsys):
    import numpy as np

    _vit().save_pretrained(tmp_path / "vit")
    np.save(tmp_path / "imgs.npy", np.random.default_rng(0).random((2, 8, 8, 3)).astype("float32"))
    argv = ["--model", str(tmp_path / "vit"), "--images", str(tmp_path / "imgs.npy"), "--no-progress", "--threads", "1"]
    assert certify_main([*argv, "--out", str(tmp_path / "out")]) == 0
    df = pd.read_csv(tmp_path / "out" / "table.csv")
    assert len(df) == 2 and df["perturbation"].str.startswith("l2 on the normalized pixels").all()
    assert (df["certified_radius"] > 0).all() and (df["certified_radius"] <= df["attack_radius"]).all()
    assert certify_main([*argv, "--perturb", "word"]) == 2
    assert "certified on its pixels" in capsys.readouterr().err
