"""A collect or run that lacks cells of an existing result never replaces it; it names the absent cells and the
command that computes them. Also: the expected-time column of --list / --dry-run, and --no-progress silencing
the libraries' own progress bars (transformers' weight loading, datasets' map)."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import cli
from harness import run as runner
from harness.run import costs
from tests._harness_fakes import registered_fakes

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake(tmp_path, monkeypatch):
    fakes = registered_fakes(tmp_path, monkeypatch, "fake_safety")
    mod, _ = next(fakes)
    yield mod
    next(fakes, None)


def _snapshot(results: Path):
    """sha256 of every file under results/ except the cache and the custom/ folders a --set run writes."""
    return {p.relative_to(results).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(results.rglob("*")) if p.is_file()
            and p.relative_to(results).parts[0] not in ("cache", "custom", ".git")}


def _git(root: Path, *args) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _main(args, capsys):
    rc = cli.main(args + ["--no-progress"], out=lambda *a: None)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("scale", [[], ["--quick"]])
def test_collect_with_a_partial_cache_leaves_committed_results_untouched(fake, tmp_path, capsys, scale):
    """A fresh clone: committed outputs, an empty cache, some cells computed by a --set run, then --collect."""
    results = tmp_path / "results"
    base = ["_fake_squares", "--results-dir", str(results)] + scale
    assert _main(base, capsys)[0] == 0  # the committed result: every cell
    shutil.rmtree(results / "cache")
    has_git = shutil.which("git") is not None
    if has_git:
        _git(results, "init", "-q")
        _git(results, "add", "-A")
        _git(results, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
             "commit", "-qm", "committed results")
    before = _snapshot(results)
    assert _main(base + ["--set", "n=1"], capsys)[0] == 0  # two of the cells, into custom/
    rc, err = _main(base + ["--collect"], capsys)
    assert rc == 1
    assert _snapshot(results) == before  # tables, figures, manifest and README byte-identical
    if has_git:
        assert _git(results, "status", "--porcelain", "--", ".", ":(exclude)cache", ":(exclude)custom") == ""
    failed = err.split("FAILED:\n", 1)[1].splitlines()
    assert failed and failed[0].strip()  # never an empty list
    assert "not in the cache" in err and "n=2,mult=1" in err and "n=1,mult=1" not in err.split("cache:")[1]
    assert "holds a complete result" in err
    cmd = next(line for line in err.splitlines() if "compute the absent cells" in line).split(": ", 1)[1]
    assert cmd.startswith("run_all.py _fake_squares") and ("--scale quick" in cmd) == bool(scale)
    # the printed command computes the absent cells; their numbers reproduce the committed ones, so the committed
    # files are kept as they are, and the run says so
    said = []
    rc = cli.main(shlex.split(cmd)[1:] + ["--no-progress"], out=lambda *a: said.append(" ".join(map(str, a))))
    err = capsys.readouterr().err + "\n".join(said)
    assert rc == 0 and _snapshot(results) == before
    assert "reproduced (" in err and "committed results kept" in err, err
    assert json.loads((results / (scale and "quick" or "") / "_fake_squares" / "manifest.json").read_text())[
        "complete"]
    # a result that differs is rewritten, and the run says which column and by how much
    table = pd.read_parquet(results / (scale and "quick" or "") / "_fake_squares" / "table.parquet")
    col = next(c for c in table.columns if c not in ("experiment", "cell", "seed", "device", "dtype", "scale",
                                                      "cell_key") and pd.api.types.is_float_dtype(table[c]))
    table.loc[0, col] = table.loc[0, col] + 1.0
    folder = results / (scale and "quick" or "") / "_fake_squares"
    table.to_parquet(folder / "table.parquet", index=False)
    table.to_csv(folder / "table.csv", index=False)
    said = []
    rc = cli.main(shlex.split(cmd)[1:] + ["--no-progress"], out=lambda *a: said.append(" ".join(map(str, a))))
    err = capsys.readouterr().err + "\n".join(said)
    assert rc == 0 and f"rewritten: the result there differs: {col} by up to" in err, err
    assert float(pd.read_parquet(folder / "table.parquet").loc[0, col]) == float(table.loc[0, col]) - 1.0


def test_failed_cell_keeps_the_complete_result_there(fake, tmp_path, capsys, monkeypatch):
    results = tmp_path / "results"
    args = ["_fake_squares", "--results-dir", str(results)]
    assert _main(args, capsys)[0] == 0
    before = _snapshot(results)
    shutil.rmtree(results / "cache")
    monkeypatch.setenv("ATTNLIP_TEST_FAIL", "3")
    rc, err = _main(args, capsys)
    assert rc == 1 and _snapshot(results) == before
    assert "boom at n=3" in err and "outputs not written" in err and "run_all.py _fake_squares" in err


def test_incomplete_result_replaced_only_by_one_holding_its_cells(fake, tmp_path, capsys, monkeypatch):
    results = tmp_path / "results"
    args = ["_fake_squares", "--results-dir", str(results)]
    monkeypatch.setenv("ATTNLIP_TEST_FAIL", "3")
    assert _main(args, capsys)[0] == 1  # no result there yet: the incomplete one is written, marked incomplete
    man = json.loads((results / "_fake_squares" / "manifest.json").read_text())
    assert not man["complete"] and "Incomplete" in (results / "README.md").read_text()
    shutil.rmtree(results / "cache")
    assert _main(args + ["--set", "n=2"], capsys)[0] == 0
    before = _snapshot(results)
    rc, err = _main(args + ["--collect"], capsys)  # n=1 cells are in the result but not in the cache
    assert rc == 1 and _snapshot(results) == before and "this result lacks (n=1,mult=1" in err
    monkeypatch.delenv("ATTNLIP_TEST_FAIL")
    assert _main(args, capsys)[0] == 0  # every cell: replaces it
    assert json.loads((results / "_fake_squares" / "manifest.json").read_text())["complete"]


def test_failed_never_prints_an_empty_list():
    r = runner.ExpResult("x", n_cells=3, cached=1, missing=2, absent=["a=1", "a=2"], command="run_all.py x")
    text = runner.format_errors([r])
    assert "2 of 3 cell(s) not in the cache: a=1; a=2" in text and "run_all.py x" in text


def test_compute_command_round_trips_through_the_parser(tmp_path):
    cfg = runner.RunConfig(scale="quick", seed=3, dtype="float32", results_dir=tmp_path / "r",
                           overrides={"n": [2, 4], "model": ["minilm"], "eps": [[0.1, 0.2]]})
    cmd = runner.compute_command(["castin_gamma"], cfg)
    args = cli.build_parser().parse_args(shlex.split(cmd)[1:])
    back = cli._run_config(args)
    assert args.names == ["castin_gamma"]
    assert (back.scale, back.seed, back.dtype, back.results_dir) == ("quick", 3, "float32", tmp_path / "r")
    assert back.overrides == cfg.overrides and back.output_root == cfg.output_root


def test_list_and_dry_run_show_expected_time_from_committed_walls(fake, tmp_path, capsys):
    results = tmp_path / "results"
    assert _main(["_fake_squares", "--results-dir", str(results)], capsys)[0] == 0
    mpath = results / "_fake_squares" / "manifest.json"
    man = json.loads(mpath.read_text())
    for c in man["cells"]:
        c["wall_s"] = 10.0 * len([m for m in (1, 2, 3) if m <= c["params"]["n"]])  # n=1: 10 s, n=3: 30 s
    mpath.write_text(json.dumps(man))
    shutil.rmtree(results / "cache")  # a fresh clone: nothing cached, 6 cells (2 x 10, 2 x 20, 2 x 30 s)

    def lines(*extra):
        out = []
        assert cli.main(["_fake_squares", "--results-dir", str(results), *extra], out=out.append) == 0
        return out

    serial = lines("--list")
    row = next(line for line in serial if line.startswith("_fake_squares"))
    total = next(line for line in serial if line.startswith("expected wall time"))
    assert row.split()[-1] == "~2.0min" and "estimate" in total
    assert serial[-1] == "  (nothing from outside the repository)"  # then what the cells read: nothing here
    pool = lines("--list", "-j", "2")
    assert next(line for line in pool if line.startswith("_fake_squares")).split()[-1] == "~1.0min"
    total = next(line for line in pool if line.startswith("expected wall time"))
    assert "at -j 2" in total and "~1.0min for 6 cell(s)" in total
    dry = lines("--dry-run", "-j", "3")
    assert "expected ~40s" in dry[1] and any(" 30s " in line for line in dry)
    assert "expected ~1.0min" in lines("--dry-run", "--quick")[1]  # no quick manifest: the full run's cells
    assert costs.makespan([30, 30, 20, 20, 10, 10], 2) == 60 and costs.makespan([5, 1], 1) == 6
    # a cell with plug-in bounds (other than the recorded ones, or none recorded) takes its built-in part's time
    rec = {'n=3,plugins=["a.b:c"]': 30.0, "n=1": 10.0}
    assert costs.wall_of(rec, 'n=3,plugins=["x:y"]') == 30.0 and costs.wall_of(rec, "n=3") == 30.0
    assert costs.wall_of(rec, 'plugins=["x:y"],n=1') == 10.0 and costs.wall_of(rec, "n=2") is None
    for bad in (float("nan"), -1e300, 1e300, float("inf"), True):  # a damaged manifest's walls are no record
        for c in man["cells"]:
            c["wall_s"] = bad
        mpath.write_text(json.dumps(man))
        shown = " ".join(lines("--dry-run") + lines("--list"))
        assert not any(s in shown for s in ("nan", "inf", "e+", "~-")), (bad, shown)


PROGRESS_FAKE = '''
import tempfile

from harness.catalog import Experiment, experiment


@experiment
class LoadsAModel(Experiment):
    """Fake: loads a tiny saved transformers model and maps a datasets table, as real cells do."""

    name = "_fake_loads_model"
    grid = {"i": [0]}

    def run(self, cell, ctx):
        return [{"loaded": load()}]


def load():
    import datasets
    from transformers import BertConfig, BertModel

    d = tempfile.mkdtemp()
    BertModel(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                         vocab_size=10)).save_pretrained(d)
    BertModel.from_pretrained(d)
    datasets.Dataset.from_dict({"a": list(range(5))}).map(lambda x: x)
    return 1
'''


@pytest.mark.parametrize("extra", [["--no-progress"], ["--no-progress", "-j", "2"]])
def test_no_progress_silences_library_bars(tmp_path, extra):
    mod = tmp_path / "fake_progress.py"
    mod.write_text(PROGRESS_FAKE)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")}
    env.update(ATTNLIP_EXPERIMENTS_PATH=str(mod), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    # the control: the same loading, outside the runner, draws both bars
    ctl = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
                          "import fake_progress; fake_progress.load()"], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert ctl.returncode == 0, ctl.stderr
    assert "Loading weights" in ctl.stderr and "Map" in ctl.stderr
    p = subprocess.run([sys.executable, str(REPO / "run_all.py"), "_fake_loads_model", "--results-dir",
                        str(tmp_path / "results"), "--no-figures", *extra], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Loading weights" not in p.stderr and "Map" not in p.stderr and "it/s" not in p.stderr
    assert "1 computed" in p.stdout


def test_pool_lines_show_each_experiments_cell_time(fake, tmp_path, capsys, monkeypatch):
    """In a pool run the experiments share one batch, so each line's bracket is the compute time of its own cells
    ("[cells 0.1s]"), not the time since the run started, which would read the same on every line."""
    from harness.run import runner as R

    said = []
    monkeypatch.setattr(R, "_execute_all", lambda todo, cfg, desc, statuses: statuses.update(
        {s.key: R.status_of(s, "ok") for s in todo}) or None)
    rc = cli.main(["_fake_squares", "--results-dir", str(tmp_path / "r"), "--executor", "process", "-j", "2",
                   "--no-progress"], out=lambda *a: said.append(" ".join(map(str, a))))
    line = next(x for x in said if x.startswith("_fake_squares: "))
    assert "[cells " in line, (rc, said)


def test_serial_lines_show_each_experiments_own_time(fake, tmp_path, monkeypatch):
    """Serially, an experiment whose cells are all cached reports its own time, not the time the experiments
    before it took to compute."""
    results = tmp_path / "r"
    quiet = dict(out=lambda *a: None)
    assert cli.main(["_fake_squares", "--results-dir", str(results), "--no-progress", "--no-figures"], **quiet) == 0
    monkeypatch.setenv("ATTNLIP_TEST_SLEEP", "0.5")
    said = []
    assert cli.main(["_fake_slow", "_fake_squares", "--set", "i=0,1", "--results-dir", str(results), "--no-progress",
                     "--no-figures"], out=lambda *a: said.append(" ".join(map(str, a)))) == 0
    slow = next(x for x in said if x.startswith("_fake_slow: "))
    cached = next(x for x in said if x.startswith("_fake_squares: "))
    took = {x: float(x.split("[")[-1].rstrip("s]")) for x in (slow, cached)}
    assert "0 computed, 6 cached" in cached and took[cached] < took[slow], (slow, cached)  # slow: >= 2 x 0.5 s


@pytest.mark.parametrize("flag", ["--results-dir", "--cache-dir", "analyze --out"])
def test_a_symlink_loop_as_an_output_folder_is_one_line(tmp_path, capsys, flag):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    if flag == "analyze --out":
        from harness.analyze import cli as analyze_cli

        rc = analyze_cli.main(["--model", "bert-tiny", "--text", "hello", "--no-progress", "--out", str(loop)])
    else:
        rc = cli.main(["jasmin_softmax", "--scale", "test", "--no-progress", flag, str(loop / "sub")],
                      out=lambda *a: None)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len([x for x in err if "error" in x]) == 1 and "loop" in err[-1].lower(), err
