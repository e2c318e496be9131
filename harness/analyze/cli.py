"""`attnlip analyze`: every bound and the truth for a model and its inputs. Entry point: main(argv) -> exit status
(0: done and every bound sound; 1: some bound below the truth (unsound), named in summary.md; 2: usage error).

Every option is checked before computing (harness.analyze.validate): a user mistake prints one line naming the
option and its fix on stderr and exits 2, never a traceback and never a silently different analysis."""
from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from pathlib import Path
from typing import List, Optional

from harness.analyze import validate
from harness.analyze.options import ANALYZE_DTYPES, AnalyzeOptions
from harness.errors import MissingData
from harness.plugins import TIMEOUT_ENV, TIMEOUT_S

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
                                                  "or a Hugging Face hub name (cached, else downloaded unless "
                                                  "HF_HUB_OFFLINE=1)")
    input_options(p, "a text (repeatable; several are batched with padding)",
                  "NAME_OR_FILES[:split] through Hugging Face datasets (sst2, ag_news offline)")
    p.add_argument("--samples", type=int, default=None, help="analyze K >= 1 inputs (dataset rows drawn with "
                                                             "--seed; the first K texts/images otherwise)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help=f"truncate texts to N tokens (default {validate.DEFAULT_MAX_TOKENS}, or the model's "
                        "positions if fewer); N beyond the model's positions is refused")
    p.add_argument("--layers", default=None, help="comma-separated layer indices (default all); negative indices "
                                                  "count from the last layer, as in Python (-1 = the last)")
    p.add_argument("--out", default=None, help="output folder (table.csv/.parquet, figures, summary.md, report.json)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or mps; must be available here")
    p.add_argument("--dtype", default="float64", choices=list(ANALYZE_DTYPES))
    p.add_argument("--no-mixed", action="store_true", help="float64: iterate the truths in float64 throughout "
                   "(default: float32 iterations refined in float64, the same float64 values; docs/math.md §4)")
    p.add_argument("--eps", type=float, default=AnalyzeOptions.eps,
                   help=f"radius >= 0 of Theorem 1's delta and PGD (default {AnalyzeOptions.eps:g}; 0: skip them)")
    p.add_argument("--bound", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="a plug-in bound f(X, w[, causal]) -> per-head (..., h) values (repeatable; each call "
                        f"may take ${TIMEOUT_ENV} s, default {TIMEOUT_S:g})")
    p.add_argument("--methods", default=None, help="comma-separated registry bounds to evaluate (default all)")
    p.add_argument("--pgd-steps", type=int, default=AnalyzeOptions.pgd_steps,
                   help=f"PGD steps >= 0 (default {AnalyzeOptions.pgd_steps}; 0: skip PGD)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random starts, PGD and the dataset rows drawn "
                                                       "(0 to 2**63 - 1)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads >= 1 (default: $ATTNLIP_THREADS, $OMP_NUM_THREADS, else the cores free now, "
                        "from the 1-minute load average; a note says when that leaves cores unused)")
    p.add_argument("--no-progress", action="store_true")
    return p


def input_options(p: argparse.ArgumentParser, text_help: str, dataset_help: str) -> None:
    """The one required choice of inputs, shared by `attnlip analyze` and `attnlip certify`."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", action="append", help=text_help)
    src.add_argument("--text-file", help="one text per line")
    src.add_argument("--dataset", help=dataset_help)
    src.add_argument("--images", help="ViT: folder of PNG/JPEG images or a .npy batch")


def _inputs(a, model_spec, device):
    from harness.analyze import inputs as I

    k = a.samples
    if a.text:
        texts = a.text
    elif a.text_file:
        if not os.path.isfile(a.text_file):
            raise validate.UsageError("--text-file", f"{a.text_file!r} is not a file", "give the path of a text "
                                                                                       "file, one text per line")
        texts = I.read_text_file(a.text_file)
        validate.check_texts(texts, "--text-file", f"{a.text_file!r}")
    elif a.dataset:
        texts = I.load_dataset_texts(a.dataset, k or 1, a.seed)
        validate.check_texts(texts, "--dataset", f"dataset {a.dataset!r}")
        return texts
    else:
        model, _, _ = I.load_model(model_spec, device)
        size = getattr(model.config, "image_size", 224)
        size = size if isinstance(size, int) else size[0]
        from harness.kernels.linalg import all_finite

        fix = "give a folder of PNG/JPEG files or a .npy batch shaped (B, H, W, C) or (B, C, H, W)"
        try:
            imgs = I.load_images(a.images, size, getattr(model.config, "num_channels", 3))
        except MissingData:
            raise
        except (ValueError, RuntimeError, IndexError, TypeError, OSError) as e:  # a file that is not an image batch
            raise validate.UsageError("--images", f"{a.images} cannot be read as images ({e.__class__.__name__}: "
                                                  f"{str(e)[:160]})", fix) from None
        if imgs.dim() != 4 or imgs.shape[0] == 0 or not all_finite(imgs):
            raise validate.UsageError("--images", f"{a.images} holds no usable image (shape "
                                                  f"{tuple(imgs.shape)}, or values that are not finite)", fix)
        return imgs[:k] if k else imgs
    return texts[:k] if k else texts


def threads(requested: Optional[int], prog: str = "attnlip analyze") -> int:
    """The process settings of an analysis: freed memory kept for reuse (harness.process) and torch's thread count
    (harness.config.init_threads_choice: --threads, else the environment, else the cores a live CPU sample finds
    free). When an automatic count leaves cores unused, one note says why and how to use them all. Returns the
    count."""
    from harness import config, process

    problem = config.threads_problem(requested)
    if problem:
        raise validate.UsageError("--threads", *problem)
    cores = config.available_cores()
    process.retain_freed_memory()
    choice = config.init_threads_choice(requested)
    if choice.source in ("cpu sample", "load average") and choice.count < cores:
        print(f"{prog}: note: {choice.count} of {cores} cores ({choice.detail}); --threads {cores} uses "
              f"all of them", file=sys.stderr)
    return choice.count


# PGD steps beyond this are refused: each step is a forward and backward pass of every layer analyzed, and the
# attack's value stops moving long before (the papers use 10-200 steps).
MAX_PGD_STEPS = 10_000


def check_pgd_steps(steps: int) -> None:
    if steps > MAX_PGD_STEPS:
        raise validate.UsageError("--pgd-steps", f"{steps} steps would run for hours (each is a forward and backward "
                                                 "pass of every layer analyzed)",
                                  f"pass at most {MAX_PGD_STEPS} (default 20; the papers use 10-200)")


def check_seed(seed: int) -> None:
    """--seed: what every generator seeded with it accepts (harness.config.seed_problem), else a UsageError."""
    from harness.config import seed_problem

    problem = seed_problem(seed)
    if problem:
        raise validate.UsageError("--seed", *problem)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "analyze":
        argv = argv[1:]
    a = parser().parse_args(argv)  # exits 2 itself on a malformed command line
    import torch

    from harness.progress import progress_bars_silenced

    before = torch.get_num_threads()
    try:
        with progress_bars_silenced(a.no_progress):  # the model library's bars too (weight loading)
            return _run(a)
    finally:
        torch.set_num_threads(before)  # in-process callers get their thread count back


def check_out(out: Optional[str]) -> Optional[Path]:
    """--out, checked before anything is computed: a folder (created if absent) that is writable and not part of
    the experiment runner's results (results/ of this checkout, or any folder holding a run_all.py manifest), so an
    analysis never overwrites committed results and never fails after computing."""
    if not out:
        return None
    from harness.store.codehash import REPO_ROOT

    from harness.store.atomic import folder_problem, unwritable

    path = Path(out).expanduser()
    why = folder_problem(path)
    if why:
        raise validate.UsageError("--out", why, "name a folder (created if absent)")
    resolved = path.resolve()
    results = (REPO_ROOT / "results").resolve()
    ours = resolved == results or resolved.is_relative_to(results) and not resolved.is_relative_to(results / "cache")
    man = path / "manifest.json"
    if ours or (man.is_file() and '"experiment"' in man.read_text(errors="replace")[:4000]):
        raise validate.UsageError("--out", f"{out} holds results of run_all.py, which an analysis would overwrite",
                                  "name a folder outside results/ (e.g. --out analyze-out)")
    why = unwritable(path)
    if why:
        raise validate.UsageError("--out", why, "name a folder you can write to")
    return path


def check_model_folder(model: str) -> None:
    """A model folder is a file a user hands us: refuse, before transformers opens it, one that would run code.
    - config.json (or tokenizer_config.json) with an `auto_map`, or a `model_type` transformers does not know: the
      folder's own Python would be needed (transformers asks "run the custom code? [y/N]" on stdin, and any `y`
      runs it). AttnLip never runs code from a model folder.
    A UsageError names the file and what to do. Pickled weights (pytorch_model.bin) are read by transformers with
    torch's restricted unpickler (weights_only=True: tensors and plain containers only, nothing executes); one that
    holds anything else is refused there, and `_run` turns that into one line."""
    import json

    folder = Path(model)
    if not folder.is_dir():
        return
    for name in ("config.json", "tokenizer_config.json"):
        f = folder / name
        if not f.is_file():
            continue
        try:
            hf_config = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise validate.UsageError("--model", f"{f} is not readable JSON ({e.__class__.__name__})",
                                      "save the model again with model.save_pretrained(DIR)") from None
        if not isinstance(hf_config, dict):
            raise validate.UsageError("--model", f"{f} holds no JSON object", "save the model again with "
                                      "model.save_pretrained(DIR)")
        if "auto_map" in hf_config:
            raise validate.UsageError("--model", f"{f} asks to run the folder's own Python code (auto_map); AttnLip "
                                      "never runs code from a model folder", "use a model whose architecture "
                                      "transformers ships (a standard model_type) and drop auto_map")
        if name == "config.json":
            from transformers import CONFIG_MAPPING

            kind = hf_config.get("model_type")
            if kind not in CONFIG_MAPPING:
                raise validate.UsageError("--model", f"{f}: model_type {kind!r} is not an architecture transformers "
                                          "ships, so only the folder's own code could build it, which AttnLip never "
                                          "runs", "save a model of a standard architecture (bert, gpt2, llama, ...)")


def _run(a) -> int:
    """One analysis; the plug-in bounds it registered are unregistered after it, so a caller in the same process
    (a test, a notebook) never meets them in its own analyses."""
    from harness.bounds import registry

    before = set(registry.bound_names())
    try:
        return _analysis(a)
    finally:
        for name in set(registry.bound_names()) - before:
            registry.unregister_bound(name)


def _analysis(a) -> int:
    from harness.analyze import core, report

    try:
        threads(a.threads)
        check_pgd_steps(a.pgd_steps)
        check_seed(a.seed)
        validate.check_options(a)
        options = AnalyzeOptions(dtype=a.dtype, device=a.device, eps=a.eps, pgd_steps=a.pgd_steps, seed=a.seed,
                                 mixed=not a.no_mixed)  # the computing options, checked here once
        check_out(a.out)
        check_model_folder(a.model)
        layers = None if a.layers is None else validate.parse_layers(a.layers)
        methods = None if a.methods is None else [m.strip() for m in a.methods.split(",") if m.strip()]
        inputs = _inputs(a, a.model, a.device)
        tm = {}
        t0 = time.perf_counter()
        df = core.analyze(a.model, inputs, options, layers=layers, methods=methods, bounds=a.bound,
                          max_tokens=a.max_tokens, progress=not a.no_progress, timings=tm,
                          default_max_tokens=validate.DEFAULT_MAX_TOKENS)
    except (MissingData, ValueError, ImportError, AttributeError, OSError) as e:  # user input, not a bug
        print(f"attnlip analyze: error: {e}", file=sys.stderr)
        return 2
    except pickle.UnpicklingError as e:  # weights_only=True refused a pickle that holds more than tensors
        print(f"attnlip analyze: error: --model {a.model}: its pickled weights hold objects other than tensors "
              f"({str(e).splitlines()[0][:160]}), and AttnLip never unpickles those. Fix: convert them to "
              f"safetensors where you trust the file: model.save_pretrained(DIR, safe_serialization=True)",
              file=sys.stderr)
        return 2
    df = report.honest_convergence(df)
    for note in df.attrs.get("notices", []):
        print(f"attnlip analyze: note: {note}", file=sys.stderr)
    meta = dict(df.attrs, total_s=time.perf_counter() - t0, forward_s=tm.get("forward_s"),
                layer_s=tm.get("layers_s"))
    print(report.layer_table(df))
    bad = report.unsound(df)
    if a.out:
        try:
            report.write(df, a.out, meta)
        except OSError as e:  # checked writable before computing; the disk filled up or the folder went away since
            print(f"attnlip analyze: error: writing {a.out} failed: {e.__class__.__name__}: {e}", file=sys.stderr)
            return 1
        print(f"wrote {Path(a.out) / 'table.csv'}, table.parquet, distribution.csv, heatmap.png, layers.png, "
              f"summary.md, report.json ({meta['total_s']:.1f} s)")
    else:
        print("attnlip analyze: note: nothing written (--out FOLDER keeps the table, figures and summary)",
              file=sys.stderr)
    if len(bad):
        print(f"UNSOUND: {', '.join(sorted(set(bad['method'])))} below the truth or not a finite number at "
              f"{len(bad)} row(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
