"""`run_all.py --verify`: committed quick-scale numbers reproduce on this checkout (a cheap sample, recomputed from an
empty cache); an edited committed number is caught in either copy of the table (exit 1, the column or the copy
named); missing data is "cannot verify" with the command that gets it (exit 3); `--stamp` records the verification.

The sample (CHEAP) is cells that need no shared data and no trained model, about 10 s in all on one core: an exact
quantity from each paper's toolkit (Castin's radius bounds, JaSMin's interlacing and softmax, mass splitting)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from harness import cli
from harness.run import verify as V
from harness.store.codehash import REPO_ROOT

RESULTS = REPO_ROOT / "results"
CHEAP = ["castin_radius_quadratic", "castin_radius_edge", "jasmin_interlacing", "jasmin_softmax"]


def _run(argv, capsys):
    code = cli.main(argv)
    cap = capsys.readouterr()
    return code, cap.out + cap.err


@pytest.mark.skipif(not (RESULTS / "quick").is_dir(), reason="no committed quick-scale results")
def test_committed_quick_sample_reproduces(capsys, committed_kernels):
    code, out = _run(["--verify", "--quick", "--verify-sample", "1", "--no-progress", *CHEAP], capsys)
    assert code == 0, out
    for name in CHEAP:
        assert f"== {name} (quick): reproduced (" in out, out
    assert f"verify (quick): {len(CHEAP)} reproduced" in out


@pytest.fixture
def results_copy(tmp_path):
    """A copy of the committed quick tables of one cheap experiment (the tests edit it, never the repository)."""
    name = "castin_radius_quadratic"
    src = RESULTS / "quick" / name
    if not src.is_dir():
        pytest.skip("no committed quick-scale results")
    dst = tmp_path / "results" / "quick" / name
    shutil.copytree(src, dst)
    return tmp_path / "results", dst, name


def test_an_edited_committed_number_fails_with_the_diff(results_copy, capsys):
    root, folder, name = results_copy
    table = pd.read_parquet(folder / "table.parquet")
    col = "lipschitz"
    assert col in table.columns
    table.loc[3, col] = table.loc[3, col] * (1 + 1e-6)  # far below any plot's resolution, far above rounding
    table.to_parquet(folder / "table.parquet", index=False)
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 1, out
    line = next(x for x in out.splitlines() if x.strip().startswith(col + " "))
    assert "NO (1 over)" in line and "1e-09" in line, line
    assert f"worst {col}: " in out and "row 3" in out
    assert "table.csv differs from table.parquet" in out and f"column {col}" in out  # the copies disagree too
    assert f"1 differs ({name})" in out
    assert not (folder / "cache").exists() and not (root / "cache").exists()  # nothing written beside the tables


def test_an_edited_csv_number_fails(results_copy, capsys):
    """Readers open table.csv: a number edited there alone (parquet untouched) is a difference."""
    root, folder, name = results_copy
    import csv
    import io

    rows = list(csv.reader(io.StringIO((folder / "table.csv").read_text())))
    col = rows[0].index("lipschitz")
    rows[2][col] = repr(float(rows[2][col]) * (1 + 1e-12))
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (folder / "table.csv").write_text(buf.getvalue())
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 1, out
    assert "differs: table.csv differs from table.parquet" in out and "row 1 column lipschitz" in out, out


def test_csv_only_and_missing_or_extra_rows(results_copy, capsys):
    """Without parquet the CSV is read; a committed row the code no longer produces is a mismatch."""
    root, folder, name = results_copy
    table = pd.read_parquet(folder / "table.parquet")
    (folder / "table.parquet").unlink()
    pd.concat([table, table.iloc[[0]]]).to_csv(folder / "table.csv", index=False)
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 1 and f"{len(table) + 1} committed rows, {len(table)} recomputed" in out, out


def test_a_cell_gone_from_the_grid_is_a_mismatch(results_copy, capsys):
    root, folder, name = results_copy
    table = pd.read_parquet(folder / "table.parquet")
    table["cell"] = table["cell"] + ",extra=1"
    table.to_parquet(folder / "table.parquet", index=False)
    table.to_csv(folder / "table.csv", index=False)
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 1 and "not a cell of the current quick grid" in out, out


def test_usage_errors_and_stale_note(results_copy, capsys):
    root, folder, name = results_copy
    code, out = _run(["--verify", "--quick", "--seed", "3", "--results-dir", str(root), name], capsys)
    assert code == 2 and "--seed 3" in out and "drop" in out
    for bad in ("0", "x"):
        code, out = _run(["--verify", "--quick", "--verify-sample", bad, "--results-dir", str(root), name], capsys)
        assert code == 2 and "--verify-sample must be a whole number >= 1 or 'all'" in out
    code, out = _run(["--stamp", "--quick", "--results-dir", str(root), name], capsys)
    assert code == 2 and "--stamp only means something with --verify" in out
    man = json.loads((folder / "manifest.json").read_text())
    man["code_hash"] = "0" * 64
    (folder / "manifest.json").write_text(json.dumps(man))
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 0 and "committed with compute code 0000000000" in out, out


def test_tolerance_lookup_and_sampling_order():
    class E:
        verify_tol = {"default": 1e-9, "step_*": None, "acc": 1e-3}

    assert V.tolerance(E, "acc") == 1e-3 and V.tolerance(E, "step_s") is None and V.tolerance(E, "x") == 1e-9
    man = {"cells": [{"cell": "a", "wall_s": 5.0}, {"cell": "b", "wall_s": 1.0}, {"cell": "c"}]}
    assert V.sample(man, ["a", "a", "b", "c"], 2) == ["b", "a", "c"]  # 2 cheapest, then at most 2 drawn
    assert V.sample(man, ["c", "b", "a"], None) == ["b", "a", "c"]
    many = {"cells": [{"cell": f"c{i}", "wall_s": float(i)} for i in range(20)]}
    labels = [c["cell"] for c in many["cells"]]
    got = V.sample(many, labels, 2, seed="exp")
    assert got[:2] == ["c0", "c1"] and len(got) == 4 and len(set(got)) == 4
    assert got == V.sample(many, labels, 2, seed="exp")  # seeded: the same cells everywhere
    assert {tuple(V.sample(many, labels, 2, seed=s)) for s in ("a", "b", "c", "d")} != {tuple(got)}
    from harness.run import verify_compare as C

    assert C._same("", float("nan")) and C._same(None, "") and not C._same("a", "") and C._same(1.0, "1.0")
    d = V.ColumnDiff("x", 1e-9)
    V._compare_value(d, "a", 0, 2.0, 2.0 + 1e-9)  # 5e-10 relative: within
    V._compare_value(d, "a", 1, float("nan"), float("nan"))
    assert d.ok
    V._compare_value(d, "a", 2, 1.0, float("nan"))
    assert not d.ok and "row 2" in d.worst


def test_stamp_records_the_verification_and_catches_later_edits(results_copy, capsys, monkeypatch):
    from harness.run import stamp as S

    root, folder, name = results_copy
    monkeypatch.setattr(S._manifest, "git_info", lambda: {"commit": "c0ffee" * 6 + "abcd", "dirty": False})
    code, out = _run(["--verify", "--quick", "--stamp", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 0 and "stamped 1 manifest(s) with commit c0ffeec0ffee" in out, out
    man = json.loads((folder / "manifest.json").read_text())
    v = man["verified"]
    assert v["commit"].startswith("c0ffee") and v["scale"] == "quick" and v["result"] == "reproduced"
    assert sorted(v["cells"]) == sorted(pd.read_parquet(folder / "table.parquet")["cell"].unique())
    assert set(v["tables"]) == {"table.csv", "table.parquet"} and v["code_hash"]
    assert man["cells"] and man["code_hash"]  # what originally computed the numbers is kept
    readme = (root / "quick" / "README.md").read_text()  # the reader sees the stamp
    assert f"## `{name}`" in readme and "*Verified at commit c0ffeec0ff (" in readme
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 0 and "this compute code verified at commit c0ffeec0ffee" in out, out
    # an edit of both copies after the stamp (so that they agree) is still caught
    for f in ("table.csv", "table.parquet"):
        (folder / f).write_bytes((folder / f).read_bytes() + b"")
    t = pd.read_parquet(folder / "table.parquet")
    t.to_parquet(folder / "table.parquet", index=False, compression="gzip")
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 1 and "table.parquet changed since the manifest's verification stamp" in out, out
    # a dirty checkout cannot stamp: the commit would not name the code that ran
    monkeypatch.setattr(S._manifest, "git_info", lambda: {"commit": "c0ffee" * 6 + "abcd", "dirty": True})
    code, out = _run(["--verify", "--quick", "--stamp", "--results-dir", str(root), name], capsys)
    assert code == 2 and "commit or stash them first" in out


def test_missing_data_is_cannot_verify_with_the_fetch_command(tmp_path):
    """No mirror, empty caches, downloads off: the text cells of jasmin_g1_ratio cannot be recomputed, which is
    neither a difference nor a pass (exit 3), and the output names the dataset and the command that gets it."""
    name = "jasmin_g1_ratio"
    src = RESULTS / "quick" / name
    if not src.is_dir():
        pytest.skip("no committed quick-scale results")
    shutil.copytree(src, tmp_path / "res" / "quick" / name)
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNLIP_DATA", "HF_HOME", "HF_HUB_CACHE", "NLTK_DATA")}
    env.update(HOME=str(tmp_path / "home"), NLTK_DATA=str(tmp_path / "nltk"), HF_HOME=str(tmp_path / "hf"),
               HF_DATASETS_CACHE=str(tmp_path / "hf" / "datasets"), HF_HUB_OFFLINE="1", ATTNLIP_OFFLINE="1",
               OMP_NUM_THREADS="1", ATTNLIP_FASHION_MNIST=str(tmp_path / "none"))
    r = subprocess.run([sys.executable, "run_all.py", "--verify", "--quick", "--no-progress", "--results-dir",
                        str(tmp_path / "res"), name], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 3 and "Traceback" not in out, out[-3000:]
    assert f"== {name} (quick): cannot verify" in out and "MISMATCH" not in out
    assert "dataset 'alice' is not available" in out and "get it with: attnlip data fetch alice" in out
    assert f"verify (quick): 0 reproduced; 1 cannot verify ({name})" in out


def test_render_redraws_committed_figures_from_the_tables_alone(tmp_path, capsys):
    """--render needs no cache: figures read tables only, so the committed tables give the committed figures back,
    byte for byte (deterministic metadata), and the manifest and README are unchanged."""
    names = ["castin_gamma", "jasmin_softmax"]
    if not all((RESULTS / "quick" / n).is_dir() for n in names):
        pytest.skip("no committed quick-scale results")
    root = tmp_path / "results"
    for n in names:
        shutil.copytree(RESULTS / "quick" / n, root / "quick" / n)
    shutil.copy(RESULTS / "quick" / "README.md", root / "quick" / "README.md")
    code, out = _run(["--render", "--quick", "--results-dir", str(root), *names, "absent_here_xyz"], capsys)
    assert code == 2  # an unknown name is a usage error before anything is drawn
    code, out = _run(["--render", "--quick", "--results-dir", str(root), *names], capsys)
    assert code == 0 and f"{names[0]}: 2 figure file(s) redrawn" in out, out
    for n in names:
        for f in (RESULTS / "quick" / n).rglob("*"):
            if f.is_file():
                assert (root / "quick" / n / f.relative_to(RESULTS / "quick" / n)).read_bytes() == f.read_bytes(), f
    assert not (root / "cache").exists()


def test_render_refreshes_what_the_figures_reproduce(tmp_path, capsys):
    """figures_ref is presentation, like the figures: --render writes the experiment's current references into the
    manifest (and so the README), without touching the table."""
    from harness import catalog
    from harness.run import discovery

    n = "castin_gamma"
    if not (RESULTS / "quick" / n).is_dir():
        pytest.skip("no committed quick-scale results")
    root = tmp_path / "results"
    shutil.copytree(RESULTS / "quick" / n, root / "quick" / n)
    man_path = root / "quick" / n / "manifest.json"
    man = json.loads(man_path.read_text())
    man["figures_ref"] = ["a stale reference"]
    man_path.write_text(json.dumps(man, indent=1) + "\n")
    code, out = _run(["--render", "--quick", "--results-dir", str(root), n], capsys)
    assert code == 0, out
    discovery.load_all()
    assert json.loads(man_path.read_text())["figures_ref"] == list(catalog.get_experiment(n).figures_ref)
    assert "a stale reference" not in (root / "quick" / "README.md").read_text()
    assert (root / "quick" / n / "table.parquet").read_bytes() == (RESULTS / "quick" / n / "table.parquet").read_bytes()
