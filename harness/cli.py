"""Command line of run_all.py: select experiments, list/dry-run, run (cached), collect. See --help."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from . import config as _config, grid as _grid, lockfile as _lockfile, catalog as _catalog, run as _runner, settings
from .run import costs as _costs, discovery as _discovery, fetch as _fetch, preflight as _preflight
from .run import substitutes as _substitutes
from .store.codehash import REPO_ROOT
from .run.executors import ClusterUnavailable
from .progress import progress_bars_silenced

EPILOG = """examples:
  run_all.py                          every experiment, full scale
  run_all.py --quick                  every experiment, small grids (--list --quick says how long)
  run_all.py castin_sqrt_n 'jasmin*'  selected experiments (names or globs; also --only)
  run_all.py --list -j 2              experiments, paper figure, cached cells, expected time at -j 2
  run_all.py --dry-run --quick        the grid, cached/missing and recorded time per cell
  run_all.py --set n=2,4,8 --set temperature=1.0 jasmin_softmax
  run_all.py --jobs 4                 local process pool (-j > 1 implies --executor process)
  run_all.py --executor submitit --jobs 50   Slurm job array (local jobs when no sbatch)
  run_all.py --collect                rebuild tables/figures/README from the cache alone; an experiment with
                                      cells absent from the cache keeps the outputs it has and names them
  run_all.py --render --quick         redraw figures and README from the committed tables (no cache needed)
outputs: results/<exp>/ (full scale), results/quick/<exp>/ (--quick), results/custom/<scale>__<what differs>/
(--set, --dtype, --seed, --device): a run never replaces the outputs of another scale or other overrides.
  run_all.py --verify --stamp         after a compute change: recompute every quick cell and a sample of each
                                      full-scale experiment, compare, and stamp the manifests that reproduce
exit status: 0 ok, 1 a cell/figure failed or was skipped for missing data (after running the rest), 2 usage error;
--verify: 0 reproduced, 1 differs, 3 could not verify (missing data or weights), 2 usage error."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="run_all.py", description="AttnLip: run experiments, cache cells, "
                                 "write results/<exp>/{table.csv,figures,manifest.json} and results/README.md",
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="experiment names or globs (default: all)")
    ap.add_argument("--only", action="append", default=[], metavar="GLOB", help="select by glob (repeatable, comma-separated)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="list experiments, paper figures, cached cells and the expected time "
                      "of the rest at the chosen -j (an estimate from the committed manifests), then exit")
    mode.add_argument("--dry-run", action="store_true", help="print the grid with cached/missing and recorded time per cell, and the "
                      "expected time at the chosen -j, then exit")
    mode.add_argument("--collect", action="store_true", help="rebuild tables, figures and README from the cache only")
    mode.add_argument("--render", action="store_true",
                      help="redraw figures and results READMEs from the committed tables alone (no cache, nothing "
                           "computed): after an edit of figure or summary code")
    mode.add_argument("--verify", action="store_true",
                      help="recompute committed cells from an empty temporary cache and compare them with both "
                           "committed copies of each table (csv, parquet): every quick cell and a sample of each "
                           "full-scale experiment (without --quick/--scale: both scales). Per experiment: "
                           "reproduced, differs or cannot verify (missing data, with the command that gets it); "
                           "exit 0 all reproduced, 1 something differs, 3 something could not be verified")
    ap.add_argument("--verify-sample", default=None, metavar="N",
                    help="--verify: per experiment, the N cheapest committed cells (committed per-cell wall time) "
                         "and N others drawn with a seed; 'all' for every cell (default: all at quick scale, 2 + 2 "
                         "at full scale)")
    ap.add_argument("--stamp", action="store_true",
                    help="--verify: record the verifying commit, the recomputed cells and the tables' sha256 in "
                         "the manifest of each experiment that reproduced (needs a checkout without uncommitted "
                         "changes outside results/)")
    ap.add_argument("--force", action="store_true", help="recompute cells even when cached")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="override a grid parameter: n=8, n=2,4,8, n=[2,4], flag=true (repeatable)")
    scale = ap.add_mutually_exclusive_group()
    scale.add_argument("--quick", action="store_const", const="quick", dest="scale", help="small grids (scale 'quick')")
    scale.add_argument("--scale", choices=list(_config.SCALES), dest="scale",
                       help="grid scale: full (default), quick, test (the smoke-test scale), paper (the papers' own "
                            "sizes, for a GPU machine with network; with no names: the experiments declaring it)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto (default cpu)")
    ap.add_argument("--dtype", default="float64", choices=list(settings.DTYPES),
                    help="compute dtype every experiment uses (one that cannot refuses before computing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--executor", choices=_runner.EXECUTORS, default=None,
                    help="default: submitit with --cluster/--executor-param, process with -j > 1 or "
                         "--fresh-workers, else serial")
    ap.add_argument("--jobs", "-j", type=int, default=1, help="parallel workers / Slurm array parallelism")
    ap.add_argument("--cluster", default=None, help="submitit cluster: slurm | local | debug (default: slurm if sbatch exists, else local)")
    ap.add_argument("--executor-param", action="append", default=[], metavar="KEY=VALUE",
                    help="extra submitit parameter, e.g. slurm_partition=gpu, gpus_per_node=1 (repeatable)")
    ap.add_argument("--fresh-workers", action="store_true",
                    help="process executor: run every cell in a new worker process (memory is returned between "
                         "cells; costs a process start and imports per cell)")
    ap.add_argument("--timeout-min", type=int, default=60, help="submitit job time limit (minutes)")
    ap.add_argument("--results-dir", type=Path, default=REPO_ROOT / "results")
    ap.add_argument("--cache-dir", type=Path, default=None, help="default: <results-dir>/cache")
    ap.add_argument("--no-figures", action="store_true", help="skip figures (tables and manifests only)")
    ap.add_argument("--no-progress", action="store_true",
                    help="no progress bars, the libraries' own included (model weight loading, datasets); also "
                         "the default when stderr is not a terminal")
    ap.add_argument("--bound", action="append", default=[], metavar="MODULE:FUNCTION",
                    help="add a plug-in bound f(X, w, causal=False) -> per-head (h,) upper bounds (attribute "
                         "scope='layer' for per-layer) to the experiments that evaluate every registered bound "
                         "(bound_leaderboard); checked against the truth: sound=False where it is below (repeatable)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads per worker (default: cores // jobs for pools, torch's own when serial)")
    return ap


def _executor(args) -> str:
    """--executor, else what the other flags ask for: submitit for --cluster / --executor-param, the local process
    pool for -j > 1 or --fresh-workers (so `run_all.py -j 2` runs two cells at once), serial otherwise."""
    if args.executor is not None:
        return args.executor
    if args.cluster or args.executor_param:
        return "submitit"
    return "process" if args.jobs > 1 or args.fresh_workers else "serial"


def _run_config(args) -> _runner.RunConfig:
    executor = _executor(args)
    if executor != "submitit":  # a cluster's nodes are not this machine
        _config.check_threads(args.threads, args.jobs if executor == "process" else 1)
    eparams = {}
    for k, v in _grid.parse_set(args.executor_param).items():
        eparams[k] = v[0] if len(v) == 1 else v
    return _runner.RunConfig(
        scale=args.scale or "full", seed=args.seed, dtype=args.dtype, device=_config.resolve_device(args.device),
        results_dir=args.results_dir, cache_dir=args.cache_dir, executor=_executor(args), jobs=args.jobs,
        force=args.force, overrides=_grid.parse_set(args.sets), progress=not args.no_progress and sys.stderr.isatty(),
        figures=not args.no_figures, cluster=args.cluster, executor_params=eparams, timeout_min=args.timeout_min,
        fresh_workers=args.fresh_workers, threads=args.threads, bounds=list(args.bound))


def _short_cost(walls, unknown: int, workers: int) -> str:
    """'~5min', '~5min+2?' (2 cells without a recorded time), '?' (none recorded), '0s' (nothing to compute)."""
    if not walls:
        return f"{unknown}?" if unknown else "0s"
    return f"~{_costs.fmt_seconds(_costs.makespan(walls, workers))}" + (f"+{unknown}?" if unknown else "")


def _total_line(all_walls, unknown: int, n_todo: int, workers: int) -> str:
    return (f"expected wall time at -j {workers} ({'serial' if workers == 1 else f'{workers} workers'}): "
            f"{_costs.describe(all_walls, unknown, workers) if n_todo else '0s'} for {n_todo} cell(s) to compute "
            f"({_costs.ESTIMATE_NOTE})")


def cmd_list(names: Sequence[str], cfg: _runner.RunConfig, out=print) -> None:
    workers = _costs.workers_for(cfg)
    rows = [("experiment", "reproduces", f"cells ({cfg.scale})", "cached", f"expected (-j {workers})")]
    all_walls, unknown, todo = [], 0, 0
    for n in names:
        try:
            p = _runner.plan(n, cfg, verify=False)
        except Exception as e:  # noqa: BLE001 - a broken grid must not hide the other experiments
            rows.append((n, f"ERROR {e.__class__.__name__}: {e}", "?", "?", "?"))
            continue
        cached = sum(t.state == "cached" for t in p.tasks)
        walls, unk = _costs.estimate(p, cfg)
        all_walls += walls
        unknown += unk
        todo += len(walls) + unk
        rows.append((n, "; ".join(p.exp.figures_ref) or "-", str(len(p.tasks)), str(cached),
                     _short_cost(walls, unk, workers)))
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        out("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
    out(_total_line(all_walls, unknown, todo, workers) + "; N? = N cells without a recorded time")
    out(f"\ndatasets, models and tokenizers these experiments read ({cfg.scale} scale):")
    for line in _fetch.inventory_lines(list(names), [cfg.scale]):
        out("  " + line)
    errs = _discovery.import_errors()
    for mod, tb in errs.items():
        out(f"warning: experiment module {mod} failed to import: {tb.strip().splitlines()[-1]}")


def cmd_dry_run(names: Sequence[str], cfg: _runner.RunConfig, out=print) -> None:
    out(f"outputs would go to {cfg.output_root}; cache {cfg.cache_dir}; {cfg.dtype} on {cfg.device}")
    workers = _costs.workers_for(cfg)
    all_walls, unknown, todo = [], 0, 0
    plans, paper_total = [], []
    for n in names:
        p = _runner.plan(n, cfg, verify=True)
        plans.append(p)
        states = [("force" if cfg.force and t.state == "cached" else t.state) for t in p.tasks]
        cached = states.count("cached")
        walls, unk = _costs.estimate(p, cfg)
        all_walls += walls
        unknown += unk
        todo += len(walls) + unk
        expect = _costs.describe(walls, unk, workers) if walls or unk else '0s'
        if cfg.scale == "paper":  # no recorded times at the papers' sizes: the experiment's declared factor
            secs, how = _costs.paper_estimate(p.exp, cfg.results_dir)
            expect = f"{'~' + _costs.fmt_seconds(secs) if secs is not None else '?'} ({how})"
            paper_total.append(secs)
        out(f"{n} ({cfg.scale}): {len(p.tasks)} cells, {cached} cached, {len(p.tasks) - cached} to compute, "
            f"expected {expect}  [code {p.code[:10]}]")
        rec = _costs.recorded_walls(cfg.results_dir, n, cfg.scale)
        for t, s in zip(p.tasks, states):
            src = "".join(f"  [{s}]" for s in (t.model_source, t.data_source) if s)
            took = _costs.fmt_seconds(_costs.wall_of(rec, t.label))
            out(f"  {s:8s} {t.key[:12]}  {took:>7s}  {t.label}{src}" + (f"  ({t.why})" if t.why else ""))
    if cfg.scale == "paper":
        known = [x for x in paper_total if x is not None]
        out(f"expected at paper scale (serial sum of the declared estimates): ~{_costs.fmt_seconds(sum(known))}"
            + (f" + {len(paper_total) - len(known)} experiment(s) without an estimate" if len(known) <
               len(paper_total) else ""))
    else:
        out(_total_line(all_walls, unknown, todo, workers))
    for line in _substitutes.plan_notices(plans, cfg.scale):
        out(line)
    for line in _preflight.plan_lines(plans):
        out(line)


def cmd_render(names: Sequence[str], cfg: _runner.RunConfig, out=print) -> int:
    """--render: each experiment's figures from its committed table (figures read tables only), replaced atomically,
    its manifest's figures and paper references, then the output folder's README. 1 when a figure function failed."""
    from . import manifest as _manifest, report as _report
    from .errors import CorruptFile
    from .run.outputs import render_figures, write_manifest
    from .run.verify_compare import read_table

    bad, done = [], 0
    for n in names:
        outdir = cfg.output_root / n
        try:
            table = read_table(outdir)
            man = _manifest.read(outdir / "manifest.json") if (outdir / "manifest.json").is_file() else None
        except CorruptFile as e:
            bad.append(f"[{n}] {e}")
            continue
        if table is None or man is None:
            out(f"{n}: no committed table in {outdir}: nothing to render")
            continue
        exp = _discovery.get_experiment(n)
        try:
            figs = render_figures(exp, table, outdir)
            man["figures"], man["figures_ref"] = figs, list(exp.figures_ref)  # presentation, both
            write_manifest(outdir / "manifest.json", man)
        except Exception as e:  # noqa: BLE001 - reported; figures and manifest are replaced atomically
            bad.append(f"[{n}] redrawing failed ({e.__class__.__name__}: {e}); each file there is whole, old or new")
            continue
        done += 1
        out(f"{n}: {len(figs)} figure file(s) redrawn from {outdir / 'table.parquet'}")
    if done:
        root = cfg.output_root
        try:
            _report.write_readme(root, canonical=cfg.results_dir if not cfg.variant else None)
            out(f"rewrote {root / 'README.md'}")
        except OSError as e:  # a full or read-only disk: the README is whole, old (written atomically)
            bad.append(f"writing {root / 'README.md'} failed ({e.__class__.__name__}: {e.strerror or e}); it is "
                       "as it was")
    if bad:
        print("FAILED:\n" + "\n".join(bad), file=sys.stderr)
    return 1 if bad else 0


def _anything_cached(names: Sequence[str], cfg) -> bool:
    return any(t.state == "cached" for n in names for t in _runner.plan(n, cfg, verify=False).tasks)


def unsound_plugins(results, plugins: Sequence[str]) -> str:
    """Lines naming every --bound plug-in with a row `sound == False` (upper bound below the truth) or, in a
    certification table (columns bound, violations), a certified point that PGD broke."""
    if not plugins:
        return ""
    names = {p.partition(":")[2] for p in plugins} | set(plugins)
    lines = []
    for r in results:
        table = r.output.table if r.output else None
        if table is not None and {"bound", "violations"} <= set(table.columns):
            bad = table[table["bound"].isin(names) & (table["violations"] > 0)]
            for m, g in bad.groupby("bound"):
                lines.append(f"  [{r.name}] {m}: {int(g['violations'].sum())} certified points broken by PGD")
            continue
        if table is None or not {"method", "sound"} <= set(table.columns):
            continue
        from .analyze.report import nonfinite_undeclared

        mine = table["method"].isin(names)
        below = mine & (table["sound"].astype(str).str.lower() == "false")
        nonfinite = mine & nonfinite_undeclared(table, lower_too=True)
        for m, g in table[below].groupby("method"):
            lines.append(f"  [{r.name}] {m}: {len(g)} of {int(table['method'].eq(m).sum())} values below the truth "
                         f"(worst value/truth {float((g['value'] / g['truth']).min()):.3g})")
        for m, g in table[nonfinite].groupby("method"):
            lines.append(f"  [{r.name}] {m}: {len(g)} of {int(table['method'].eq(m).sum())} values are not a finite "
                         f"number (NaN or infinity bounds nothing)")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None, out=print) -> int:
    """CLI entry: returns the exit status (0 ok, 1 failures, 2 usage error, 130 interrupted by Ctrl-C)."""
    try:
        return _main(argv, out)
    except KeyboardInterrupt as e:  # cell files are written whole or not at all; a rerun skips those written
        kept = f"{e.kept} cell(s) kept" if isinstance(e, _runner.Interrupted) else "cells written so far kept"
        print(f"run_all.py: interrupted; {kept}, rerun to continue", file=sys.stderr)
        return 130


def _main(argv: Optional[Sequence[str]], out) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        cfg = _run_config(args)
        names = _runner.paper_selection(_runner.select(args.names, args.only), cfg, bool(args.names or args.only))
        if not names:
            out("no experiments registered")
            return 2 if args.names or args.only else 0
        _runner.check_overrides(names, cfg)
    except (KeyError, ValueError, _catalog.UnsupportedContext) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"run_all.py: error: {msg}", file=sys.stderr)
        return 2
    if (args.stamp or args.verify_sample is not None) and not args.verify:
        flag = "--stamp" if args.stamp else "--verify-sample"
        print(f"run_all.py: error: {flag} only means something with --verify", file=sys.stderr)
        return 2
    if args.render:
        return cmd_render(names, cfg, out)
    if args.verify:
        from .run import verify as _verify

        scales = [args.scale] if args.scale else ["quick", "full"]
        with progress_bars_silenced(not cfg.progress):
            return _verify.main(names, cfg, args.verify_sample, echo=out, scales=scales, stamp=args.stamp)
    if args.list:
        cmd_list(names, cfg, out)
        return 0
    if args.dry_run:
        cmd_dry_run(names, cfg, out)
        return 0
    if args.collect and not _anything_cached(names, cfg):
        print(f"run_all.py: nothing is cached in {cfg.cache_dir} for {', '.join(names)} at scale {cfg.scale} "
              f"(with these settings), so there is nothing to collect and no output was changed. Compute the "
              f"cells first: {_runner.compute_command(args.names + args.only, cfg)}", file=sys.stderr)
        return 1
    drift = _lockfile.drift_warning()
    if drift:
        print(drift, file=sys.stderr)
    t0 = time.perf_counter()
    try:
        with progress_bars_silenced(not cfg.progress):
            results = _runner.run(names, cfg, collect_only=args.collect, echo=out)
    except ClusterUnavailable as e:  # raised before anything is submitted
        print(f"run_all.py: error: {e}", file=sys.stderr)
        return 2
    bad = [r for r in results if not r.ok]
    unsound = unsound_plugins(results, cfg.bounds)
    if unsound:
        print("UNSOUND plug-in bound(s): below the truth, not a finite number, or a certificate broken by PGD:\n" +
              unsound,
              file=sys.stderr)
    skipped = sum(r.missing_data for r in results)
    tail = f"; {skipped} cell(s) skipped for missing data" if skipped else ""
    out(f"done: {len(results)} experiment(s) in {time.perf_counter() - t0:.1f}s, results in {cfg.output_root}{tail}")
    if skipped:
        print(_runner.missing_summary(results), file=sys.stderr)
    if bad:
        detail = _runner.format_errors(bad) or "\n".join(f"[{r.name}] {r.line()}" for r in bad)
        print("FAILED:\n" + detail, file=sys.stderr)
        return 1
    return 1 if unsound else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
