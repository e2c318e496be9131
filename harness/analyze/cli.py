"""`attnlip analyze`: every bound and the truth for a model and its inputs. Entry point: main(argv) -> exit status
(0: done and every bound sound; 1: some bound below the truth (unsound), named in summary.md; 2: usage error)."""
from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

from harness.errors import MissingData

EPILOG = """examples:
  attnlip analyze --model minilm --text "The cat sat on the mat." --out /tmp/an
  attnlip analyze --model minilm --dataset sst2:validation --samples 8 --max-tokens 64 --layers 0,5
  attnlip analyze --model ./my_saved_model --text-file texts.txt --bound mypkg.bounds:my_bound
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnlip analyze", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Local Lipschitz bounds of every attention layer and head of a model "
                                            "at its inputs, beside the true ||J(X)||.")
    p.add_argument("--model", required=True, help="alias (minilm, tiny-bert, tiny-gpt2), save_pretrained folder "
                                                  "or a Hugging Face name in the local cache")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", action="append", help="a text (repeatable; several are batched with padding)")
    src.add_argument("--text-file", help="one text per line")
    src.add_argument("--dataset", help="NAME_OR_FILES[:split] through Hugging Face datasets (sst2, ag_news offline)")
    src.add_argument("--images", help="ViT: folder of PNG/JPEG images or a .npy batch")
    p.add_argument("--samples", type=int, default=None, help="analyze K inputs (dataset rows drawn with --seed; "
                                                             "the first K texts/images otherwise)")
    p.add_argument("--max-tokens", type=int, default=128, help="truncate texts to N tokens (default 128)")
    p.add_argument("--layers", default=None, help="comma-separated layer indices (default all)")
    p.add_argument("--out", default=None, help="output folder (table.csv/.parquet, figures, summary.md, report.json)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--eps", type=float, default=1e-2, help="radius of Theorem 1's delta and PGD (0: skip them)")
    p.add_argument("--bound", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="a plug-in bound f(X, w[, causal]) -> per-head (..., h) values (repeatable)")
    p.add_argument("--methods", default=None, help="comma-separated registry bounds to evaluate (default all)")
    p.add_argument("--pgd-steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    return p


def _inputs(a, model_spec, device):
    from harness.analyze import inputs as I

    k = a.samples
    if a.text:
        texts = a.text
    elif a.text_file:
        texts = I.read_text_file(a.text_file)
    elif a.dataset:
        return I.load_dataset_texts(a.dataset, k or 1, a.seed)
    else:
        model, _, _ = I.load_model(model_spec, device)
        size = getattr(model.config, "image_size", 224)
        size = size if isinstance(size, int) else size[0]
        imgs = I.load_images(a.images, size, getattr(model.config, "num_channels", 3))
        return imgs[:k] if k else imgs
    return texts[:k] if k else texts


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "analyze":
        argv = argv[1:]
    a = parser().parse_args(argv)
    from harness.analyze import core, report

    try:
        layers = None if a.layers is None else [int(x) for x in a.layers.split(",") if x.strip()]
        methods = None if a.methods is None else [m.strip() for m in a.methods.split(",") if m.strip()]
        inputs = _inputs(a, a.model, a.device)
        tm = {}
        t0 = time.perf_counter()
        df = core.analyze(a.model, inputs, layers=layers, dtype=a.dtype, device=a.device, eps=a.eps,
                          methods=methods, bounds=a.bound, max_tokens=a.max_tokens, pgd_steps=a.pgd_steps,
                          seed=a.seed, progress=not a.no_progress, timings=tm)
    except (MissingData, ValueError, ImportError, AttributeError, FileNotFoundError) as e:
        print(f"attnlip analyze: error: {e}", file=sys.stderr)
        return 2
    meta = dict(df.attrs, total_s=time.perf_counter() - t0, forward_s=tm.get("forward_s"),
                layer_s=tm.get("layers_s"))
    print(report.layer_table(df))
    bad = report.unsound(df)
    if a.out:
        report.write(df, a.out, meta)
        print(f"wrote {a.out}/table.csv, table.parquet, distribution.csv, heatmap.png, layers.png, summary.md, "
              f"report.json ({meta['total_s']:.1f} s)")
    if len(bad):
        print(f"UNSOUND: {', '.join(sorted(set(bad['method'])))} below the truth at {len(bad)} row(s)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
