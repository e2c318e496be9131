"""Certified l2 radii of a BERT sentence classifier under a perturbation of one word's embedding, by CROWN and
alpha-CROWN (auto_LiRPA), in the setting of auto_LiRPA's language example and DeepT.

For each sentence the word-embedding row of one token position i (before the position/type embeddings are added and
before the embedding LayerNorm) is replaced by x with ||x - x0||_2 <= eps. The radius of a method is the largest eps
at which its lower bound on every margin logit[y] - logit[j] (j != y) is positive, found by a bracket (repeated
x4 steps from --eps0) and geometric bisection to --rtol relative width; y is the predicted class (--target pred) or
the label (--target label, radius 0 when misclassified). Seconds are the wall time of each method's search (the
one-off graph trace is reported apart as trace_seconds).

The bounded model is a pure-torch re-implementation of transformers' BertForSequenceClassification from the word
row: its input is the one perturbed row x (1, d); the other word rows, the position and type embeddings are
constant buffers. LayerNorm is written as mean / pow / sqrt / div (as in auto_LiRPA's example), attention as
explicit matmul + softmax, the activation is the config's hidden_act (relu, gelu with erf, or tanh-approximate
gelu_new), the pooler is tanh(dense(h[CLS])). Its logits are checked against the HF model (float32, --check-atol)
for every sentence before bounding. Sentences are bounded unpadded, so no attention mask is needed.

auto_LiRPA is not a dependency of this project: install its GitHub snapshot with `pip install --no-deps` (plus
appdirs, sortedcontainers, graphviz) into a folder on PYTHONPATH.

    PYTHONPATH=/tmp/alirpa python -m benchmarks.certify_crown /tmp/models/lirpa --data DIR --n 10 --out results.csv
"""
import argparse
import csv
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

COLUMNS = ["sentence_index", "label", "pred", "position", "crown_radius", "crown_seconds", "alpha_crown_radius",
           "alpha_crown_seconds", "n_tokens", "trace_seconds"]


def load_lirpa():
    """auto_LiRPA's BoundedModule, BoundedTensor, PerturbationLpNorm and stop_criterion_min, imported on demand."""
    try:
        from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm
        from auto_LiRPA.utils import stop_criterion_min
    except ImportError as e:
        raise SystemExit(f"auto_LiRPA is missing ({e}): install auto_LiRPA from its GitHub snapshot; it is a "
                         "benchmark-only tool (pip install --no-deps --target DIR, then PYTHONPATH=DIR)")
    return BoundedModule, BoundedTensor, PerturbationLpNorm, stop_criterion_min


def activation(name):
    """The elementwise function of a BertConfig.hidden_act."""
    table = {"relu": F.relu, "gelu": F.gelu, "tanh": torch.tanh,
             "gelu_new": lambda t: F.gelu(t, approximate="tanh"),
             "gelu_pytorch_tanh": lambda t: F.gelu(t, approximate="tanh")}
    if name not in table:
        raise SystemExit(f"hidden_act {name!r} is not supported here")
    return table[name]


def layer_norm(h, w, b, eps):
    u = h.mean(-1, keepdim=True)
    c = h - u
    s = c.pow(2).mean(-1, keepdim=True)
    return c / torch.sqrt(s + eps) * w + b


def _linear(src):
    lin = nn.Linear(src.in_features, src.out_features, dtype=src.weight.dtype)
    lin.load_state_dict(src.state_dict())
    lin.requires_grad_(False)
    return lin


class Layer(nn.Module):
    """One post-LN BERT encoder layer, copied from transformers' BertLayer."""

    def __init__(self, hf_layer, config):
        super().__init__()
        att = hf_layer.attention
        self.q, self.k, self.v = (_linear(m) for m in (att.self.query, att.self.key, att.self.value))
        self.o = _linear(att.output.dense)
        self.ln1_w = nn.Parameter(att.output.LayerNorm.weight.detach().clone(), requires_grad=False)
        self.ln1_b = nn.Parameter(att.output.LayerNorm.bias.detach().clone(), requires_grad=False)
        self.up = _linear(hf_layer.intermediate.dense)
        self.down = _linear(hf_layer.output.dense)
        self.ln2_w = nn.Parameter(hf_layer.output.LayerNorm.weight.detach().clone(), requires_grad=False)
        self.ln2_b = nn.Parameter(hf_layer.output.LayerNorm.bias.detach().clone(), requires_grad=False)
        self.h = config.num_attention_heads
        self.dh = config.hidden_size // self.h
        self.eps = config.layer_norm_eps
        self.act = activation(config.hidden_act)

    def forward(self, x):  # x (1, n, d)
        n, d = x.shape[1], x.shape[2]

        def heads(t):
            return t.reshape(1, n, self.h, self.dh).permute(0, 2, 1, 3)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh)
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(1, n, d)
        a = layer_norm(self.o(ctx) + x, self.ln1_w, self.ln1_b, self.eps)
        return layer_norm(self.down(self.act(self.up(a))) + a, self.ln2_w, self.ln2_b, self.eps)


class FromWordRow(nn.Module):
    """Logits of an HF BertForSequenceClassification at input_ids (1, n) as a function of the word-embedding row
    x (1, d) at token position `position`; every other input is a constant buffer."""

    def __init__(self, hf, input_ids, position):
        super().__init__()
        cfg = hf.config
        emb = hf.bert.embeddings
        n = input_ids.shape[1]
        with torch.no_grad():
            rest = emb.word_embeddings.weight[input_ids[0]].clone()  # (n, d)
            self.x0 = rest[position:position + 1].clone()  # (1, d)
            rest[position] = 0.0
            rest = rest + emb.position_embeddings.weight[:n] + emb.token_type_embeddings.weight[0]
        onehot = torch.zeros(1, n, 1, dtype=rest.dtype)
        onehot[0, position, 0] = 1.0
        self.register_buffer("rest", rest.unsqueeze(0))
        self.register_buffer("onehot", onehot)
        self.ln_w = nn.Parameter(emb.LayerNorm.weight.detach().clone(), requires_grad=False)
        self.ln_b = nn.Parameter(emb.LayerNorm.bias.detach().clone(), requires_grad=False)
        self.eps = cfg.layer_norm_eps
        self.layers = nn.ModuleList(Layer(m, cfg) for m in hf.bert.encoder.layer)
        self.pool = _linear(hf.bert.pooler.dense)
        self.cls = _linear(hf.classifier)

    def forward(self, x):  # x (1, d)
        h = self.rest + self.onehot * x.unsqueeze(1)
        h = layer_norm(h, self.ln_w, self.ln_b, self.eps)
        for layer in self.layers:
            h = layer(h)
        return self.cls(torch.tanh(self.pool(h[:, 0, :])))


def margin_spec(y, k):
    """C (1, k-1, k) with rows e_y - e_j for j != y."""
    eye = torch.eye(k, dtype=torch.float32)
    rows = [eye[y] - eye[j] for j in range(k) if j != y]
    return torch.stack(rows).unsqueeze(0)


class Certifier:
    """Certification test `ok(eps, method)` for one sentence, on one traced BoundedModule (in `dtype`; float32
    bounds of the LSE softmax relaxation are not monotone in eps at eps ~ 1e-4, float64 ones are).

    alpha-CROWN here optimises the final bound's relaxation parameters with the intermediate bounds fixed to
    CROWN's at the same eps (auto_LiRPA's default fix_interm_bounds=True, passed explicitly as interm_bounds):
    letting auto_LiRPA 0.7.1 compute them itself fails on this graph (a shape mismatch in sparse alphas of the
    LayerNorm products, or with sparse intermediate bounds off, a Reciprocal input bound below 0 even at
    eps = 1e-4). An eps that CROWN certifies counts as certified by alpha-CROWN without optimising."""

    def __init__(self, model, C, softmax, iterations, lirpa, dtype, crown_batch_size):
        BoundedModule, self.BoundedTensor, self.Ptb, stop_min = lirpa
        t0 = time.perf_counter()
        # crown_batch_size caps how many intermediate neurons are bounded at once (the attention products of an
        # n-token sentence have 4 n^2 of them; unbatched, 32 tokens need over 24 GB)
        opts = {"softmax": softmax, "crown_batch_size": crown_batch_size or float("inf"),
                "batched_crown_max_vram_ratio": 0.9,
                "optimize_bound_args": {"iteration": iterations, "stop_criterion_func": stop_min(0.0)}}
        if softmax == "complex":  # the example's options: exp(x) / sum exp(x) without the max shift
            opts.update({"exp": "no-max-input", "fixed_reducemax_index": True})
        model = model.to(dtype)
        self.x0, self.C = model.x0.to(dtype), C.to(dtype)
        self.build = lambda: BoundedModule(model, torch.zeros_like(self.x0), bound_opts=opts, device="cpu", verbose=0)
        self.bm = self.build()
        self.trace_seconds = time.perf_counter() - t0
        self.calls = self.failures = 0

    def lower(self, eps, method):
        """Lower bounds (1, k-1) on the margins; for alpha-CROWN None when CROWN already certifies eps."""
        xb = self.BoundedTensor(self.x0, self.Ptb(norm=2, eps=eps))
        self.calls += 1
        lb, _ = self.bm.compute_bounds(x=(xb,), C=self.C, method="CROWN", bound_upper=False)
        if method == "CROWN" or bool((lb > 0).all()):
            return lb.detach()
        interm = self.bm.save_intermediate()
        lb, _ = self.bm.compute_bounds(x=(xb,), C=self.C, method="alpha-CROWN", bound_upper=False,
                                       interm_bounds=interm)
        return lb.detach()

    def ok(self, eps, method):
        """Whether every margin's lower bound is positive. auto_LiRPA asserts that the LayerNorm denominator's
        bounds are positive (Reciprocal); where they are not, the ball counts as not certified. That failure is not
        monotone in eps (seen at 0.025 but not at 0.03 or 0.04, with margin bounds near the clean margin), so the
        bisection's radius is one boundary of the region where auto_LiRPA returns a bound, not necessarily the
        largest certified eps."""
        try:
            return bool((self.lower(eps, method) > 0).all())
        except AssertionError:  # the module's state is left half-updated: trace it again
            self.failures += 1
            self.bm = self.build()
            return False


def radius(ok, lo=0.0, hi=math.inf, eps0=0.05, factor=4.0, rtol=1e-3, eps_min=1e-7, eps_max=1e3):
    """Largest eps with ok(eps), to relative width rtol, given ok(lo) (lo may be 0) and not ok(hi) (hi may be inf).
    Assumes ok is monotone (larger balls contain smaller ones). Returns (lo, hi)."""
    if lo == 0.0 and hi == math.inf:
        if ok(eps0):
            lo = eps0
        else:
            hi = eps0
    while hi == math.inf:  # grow
        e = lo * factor
        if e > eps_max:
            return lo, math.inf
        if ok(e):
            lo = e
        else:
            hi = e
    while lo == 0.0:  # shrink
        e = hi / factor
        if e < eps_min:
            return 0.0, hi
        if ok(e):
            lo = e
        else:
            hi = e
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def read_dev(path, n):
    """First n (sentence, label) rows of a tsv with a `label` column and one text column."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    li = [h.strip().lower() for h in rows[0]].index("label")
    return [(r[1 - li], int(r[li])) for r in rows[1:n + 1]]


def load_model(model_dir):
    from transformers import BertForSequenceClassification, BertTokenizer

    hf = BertForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval().float()
    tok = BertTokenizer.from_pretrained(model_dir)
    return hf, tok


def certify_sentence(hf, ids, label, position, a, lirpa):
    """One CSV row (dict) for the sentence input_ids `ids` (1, n)."""
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        model = FromWordRow(hf, ids, position).eval()
        mine = model(model.x0)
    err = float((mine - ref).abs().max())
    if err > a.check_atol:
        raise SystemExit(f"re-implementation disagrees with the HF model: max |logit diff| {err:.3g}")
    pred = int(ref.argmax(-1))
    y = pred if a.target == "pred" else label
    row = dict(label=label, pred=pred, position=position, n_tokens=ids.shape[1], logit_err=err)
    if y != pred:
        row.update(crown_radius=0.0, crown_seconds=0.0, alpha_crown_radius=0.0, alpha_crown_seconds=0.0,
                   trace_seconds=0.0)
        return row
    cert = Certifier(model, margin_spec(y, ref.shape[-1]), a.softmax, a.iterations, lirpa,
                     getattr(torch, a.dtype), a.crown_batch_size)
    row["trace_seconds"] = cert.trace_seconds

    t0 = time.perf_counter()
    c_lo, c_hi = radius(lambda e: cert.ok(e, "CROWN"), eps0=a.eps0, rtol=a.rtol)
    row.update(crown_radius=c_lo, crown_seconds=time.perf_counter() - t0, crown_calls=cert.calls,
               crown_asserts=cert.failures)

    cert.calls = cert.failures = 0
    t0 = time.perf_counter()
    if a.no_alpha:
        lo = hi = float("nan")
    else:

        def alpha_ok(e):
            return cert.ok(e, "alpha-CROWN")

        # alpha-CROWN starts from CROWN's relaxation and keeps the best bound, so it normally certifies CROWN's
        # radius; confirm that rather than assume it, then search upwards from there
        if c_lo > 0 and alpha_ok(c_lo):
            hi = c_hi if (c_hi != math.inf and not alpha_ok(c_hi)) else math.inf
            lo = c_hi if hi == math.inf else c_lo
            lo, hi = radius(alpha_ok, lo=lo, hi=hi, factor=1.5, rtol=a.rtol)
        else:
            lo, hi = radius(alpha_ok, lo=0.0, hi=c_lo if c_lo > 0 else math.inf, eps0=a.eps0, rtol=a.rtol)
    row.update(alpha_crown_radius=lo, alpha_crown_seconds=time.perf_counter() - t0, alpha_calls=cert.calls,
               alpha_asserts=cert.failures)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model_dir", help="folder written by BertForSequenceClassification.save_pretrained")
    p.add_argument("--data", default=os.path.join(os.environ.get("ATTNLIP_DATA", ""), "sst2"),
                   help="folder with dev.tsv (default $ATTNLIP_DATA/sst2)")
    p.add_argument("--split", default="dev")
    p.add_argument("--n", type=int, default=10, help="first N sentences")
    p.add_argument("--position", type=int, default=1, help="perturbed token position (1: first word after [CLS])")
    p.add_argument("--max-len", type=int, default=32, help="truncate to this many tokens incl. [CLS]/[SEP]")
    p.add_argument("--target", choices=["pred", "label"], default="pred", help="class whose margins are bounded")
    p.add_argument("--softmax", choices=["lse", "complex"], default="lse",
                   help="auto_LiRPA softmax relaxation (its default 'lse'; 'complex' = exp/sum/div, the example's)")
    p.add_argument("--iterations", type=int, default=20, help="alpha-CROWN optimisation steps per bound")
    p.add_argument("--eps0", type=float, default=0.05, help="first eps tried when bracketing")
    p.add_argument("--rtol", type=float, default=1e-3, help="relative width of the final bisection bracket")
    p.add_argument("--check-atol", type=float, default=1e-5, help="max |logit diff| to the HF model")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="dtype of the bounds")
    p.add_argument("--crown-batch-size", type=int, default=512, help="auto_LiRPA crown_batch_size (0: no cap)")
    p.add_argument("--no-alpha", action="store_true", help="CROWN only")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default="", help="CSV file to write")
    a = p.parse_args(argv)

    lirpa = load_lirpa()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.dtype == "float64":
        torch.set_default_dtype(torch.float64)  # auto_LiRPA creates its own tensors in the default dtype
    hf, tok = load_model(a.model_dir)
    print(f"model {a.model_dir}: {hf.config.num_hidden_layers} layers, hidden {hf.config.hidden_size}, "
          f"{hf.config.num_attention_heads} heads, intermediate {hf.config.intermediate_size}, "
          f"{hf.config.hidden_act}; softmax relaxation {a.softmax}, alpha iterations {a.iterations}", flush=True)
    rows = []
    for i, (text, label) in enumerate(read_dev(os.path.join(a.data, a.split + ".tsv"), a.n)):
        ids = torch.tensor([tok(text, truncation=True, max_length=a.max_len)["input_ids"]])
        if not 0 < a.position < ids.shape[1] - 1:
            print(f"sentence {i}: position {a.position} is not a word of {ids.shape[1]} tokens; skipped")
            continue
        row = dict(sentence_index=i, **certify_sentence(hf, ids, label, a.position, a, lirpa))
        rows.append(row)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    done = [r for r in rows if r["pred"] == (r["pred"] if a.target == "pred" else r["label"])]
    for key in ("crown_radius", "crown_seconds", "alpha_crown_radius", "alpha_crown_seconds"):
        vals = [r[key] for r in done if not math.isnan(r[key])]
        if vals:
            print(f"mean {key} {sum(vals) / len(vals):.4g} over {len(vals)} sentences")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
