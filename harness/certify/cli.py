"""`attnlip certify`: certified l2 robustness radii of a transformer classifier's predictions, beside the smallest
adversarial radius an attack finds. See --help and docs/math.md §6."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

from harness.analyze import validate
from harness.errors import MissingData

EPILOG = """examples:
  attnlip certify --model ./my-sst2-bert --dataset sst2:dev --samples 100 --out certify-out
  attnlip certify --model ./my-sst2-bert --text "a gripping, funny film" --perturb embeddings
  attnlip certify --model ./my-vit --images ./imgs --perturb pixels

Models: a Hugging Face sequence classifier (BERT / MiniLM, DistilBERT) or image classifier (ViT) saved with
save_pretrained (or a hub name), with its trained head. Labels: a dataset's (sst2), else the model's prediction."""


def parser() -> argparse.ArgumentParser:
    from harness.analyze.cli import input_options

    p = argparse.ArgumentParser(prog="attnlip certify", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Certified l2 radius of each prediction (layer by layer through every "
                                            "block, and the network route), beside an attack's radius.")
    p.add_argument("--model", required=True, help="save_pretrained folder of a classifier, or a hub name")
    input_options(p, "a text to certify (repeatable)", "sst2[:dev|train] (labels from the dataset)")
    p.add_argument("--samples", type=int, default=None, help="certify the first K >= 1 inputs (default: all; "
                                                             "a dataset: 20)")
    p.add_argument("--perturb", default=None, choices=["word", "embeddings", "pixels"],
                   help="what eps measures: one word's embedding (default for text), all word embeddings, or the "
                        "pixels (ViT, the default there)")
    p.add_argument("--position", type=int, default=1, help="--perturb word: the token whose embedding moves "
                                                           "(default 1, the first after [CLS])")
    p.add_argument("--max-tokens", type=int, default=None, help="truncate texts to N tokens (default 128, at "
                                                                 "most the model's positions)")
    p.add_argument("--methods", default=None, help="comma-separated attention certificates of the bound registry "
                                                   "(default: every registered ball-change certificate)")
    p.add_argument("--no-attack", action="store_true", help="skip the attack (no adversarial radius)")
    p.add_argument("--no-network", action="store_true", help="layer-by-layer route only")
    p.add_argument("--out", default=None, help="output folder (table.csv, summary.md, radii.png)")
    p.add_argument("--threads", type=int, default=None, help="torch threads >= 1 (default: as attnlip analyze)")
    p.add_argument("--no-progress", action="store_true")
    return p


def load_classifier(spec: str):
    """(model, tokenizer or None): a classifier with its trained head, never running the folder's code."""
    from transformers import AutoConfig, AutoTokenizer

    from harness.analyze.cli import check_model_folder
    from harness.models import checkpoint, hub

    if os.path.isdir(spec):
        check_model_folder(spec)
        checkpoint.check_folder(spec, classifier=True)  # damaged weights or absurd sizes, before loading
    elif spec.startswith(("/", ".", "~")):
        raise validate.UsageError("--model", f"{spec!r} is not a folder", "give a save_pretrained folder or a hub "
                                                                         "name")
    try:
        cfg = AutoConfig.from_pretrained(spec, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise MissingData(f"--model {spec!r}: no readable config.json ({str(e).splitlines()[0][:200]})") from None
    heads = [a for a in (cfg.architectures or []) if a.endswith(checkpoint.HEADED)]
    if not heads:
        raise validate.UsageError("--model", f"{spec!r} is not a classifier with a trained head (architectures "
                                  f"{cfg.architectures})", "certify a model saved from a "
                                  "...ForSequenceClassification or ViTForImageClassification")
    if os.path.isdir(spec):
        model = checkpoint.load(spec, classifier=True, attn_implementation="eager").eval()
    else:
        model = checkpoint.classifier_class(cfg).from_pretrained(spec, attn_implementation="eager",
                                                                 trust_remote_code=False).eval()
    tok = None
    if cfg.model_type != "vit" and (not os.path.isdir(spec) or hub.has_tokenizer(spec)):
        tok = AutoTokenizer.from_pretrained(spec, trust_remote_code=False)
    return model, tok


def _inputs(a, model):
    """(inputs, labels or None)."""
    from harness.analyze import inputs as I

    k = a.samples
    if a.samples is not None and a.samples < 1:
        raise validate.UsageError("--samples", f"{a.samples}", "pass K >= 1")
    if a.text:
        validate.check_texts(a.text, "--text")
        return a.text[:k] if k else a.text, None
    if a.text_file:
        if not os.path.isfile(a.text_file):
            raise validate.UsageError("--text-file", f"{a.text_file!r} is not a file", "one text per line")
        texts = I.read_text_file(a.text_file)
        validate.check_texts(texts, "--text-file", f"{a.text_file!r}")
        return texts[:k] if k else texts, None
    if a.dataset:
        from harness.data import text as corpora

        name, _, split = a.dataset.partition(":")
        if name.lower().replace("-", "_") != "sst2":
            raise validate.UsageError("--dataset", f"{a.dataset!r}: certify reads labelled sst2[:dev|train]",
                                      "pass --dataset sst2:dev, or texts with --text / --text-file")
        split = I.SHIPPED["sst2"].get(split or "dev")  # the split names analyze reads sst2 with
        if split is None:
            raise validate.UsageError("--dataset", f"{a.dataset!r}: unknown split", "use sst2:dev or sst2:train")
        texts, labels = corpora.load_labeled("sst2", split)
        k = k or 20
        return list(texts[:k]), list(labels[:k])
    size = getattr(model.config, "image_size", 224)
    imgs = I.load_images(a.images, size if isinstance(size, int) else size[0], getattr(model.config, "num_channels", 3))
    return (imgs[:k] if k else imgs), None


def _token_budget(a, model, tok, inputs) -> Optional[int]:
    """--max-tokens checked as analyze checks it (within the model's positions; the default capped there), with a
    note when texts are cut."""
    if tok is None or not all(isinstance(t, str) for t in inputs):
        return a.max_tokens
    notices: List[str] = []
    budget = validate.token_budget(a.max_tokens, validate.DEFAULT_MAX_TOKENS, model, tok, notices)
    validate.truncation_notice(tok, inputs, budget, validate.position_limit(model), notices)
    for n in notices:
        print(f"attnlip certify: note: {n}", file=sys.stderr)
    return budget


def main(argv: Optional[List[str]] = None) -> int:
    a = parser().parse_args(argv)
    from harness.analyze.cli import check_out, threads
    from harness.progress import progress_bars_silenced

    try:
        out = check_out(a.out)
        threads(a.threads, "attnlip certify")
        with progress_bars_silenced(a.no_progress):  # the model library's bars too (weight loading)
            return _run(a, out)
    except (validate.UsageError, MissingData, ValueError) as e:
        print(f"attnlip certify: {e}", file=sys.stderr)
        return 2


def _run(a, out: Optional[Path]) -> int:
    from harness.certify import report, run

    model, tok = load_classifier(a.model)
    perturb = a.perturb or ("pixels" if model.config.model_type == "vit" else "word")
    inputs, labels = _inputs(a, model)
    max_tokens = _token_budget(a, model, tok, inputs)
    names = [n.strip() for n in a.methods.split(",") if n.strip()] if a.methods else None
    rows = run.certify_model(model, inputs, labels, tokenizer=tok, perturb=perturb, position=a.position,
                             attack=not a.no_attack, network=not a.no_network, names=names,
                             max_tokens=max_tokens, progress=not a.no_progress)
    df = report.frame(rows)
    print(report.compact(df))
    s = report.stats(df)
    print(f"accuracy {s['accuracy']:.3f}; median certified radius {s['median_certified_radius']:.4g}, median attack "
          f"radius {s['median_attack_radius']:.4g}; violations {s['violations']}")
    if out is not None:
        meta = dict(model=a.model, perturbation=rows[0]["perturbation"] if rows else perturb)
        try:
            written = report.write(df, out, meta)
        except OSError as e:  # checked writable before computing; the disk filled up or the folder went away since
            print(f"attnlip certify: error: writing {out} failed: {e.__class__.__name__}: {e}", file=sys.stderr)
            return 1
        for p in written:
            print(f"wrote {p}")
    return 1 if s["violations"] else 0
