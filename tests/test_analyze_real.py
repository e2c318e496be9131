"""`attnlip analyze` on a second real trained model: rxnfp 0.1.0 (PyPI, MIT; BERT, 12 layers, d=256, 4 heads,
trained on reaction SMILES), installed by `make install` with --no-deps. Skips when it is not installed."""
import importlib.util
import json
import shutil
from pathlib import Path

import pytest


def _rxnfp_folder():
    spec = importlib.util.find_spec("rxnfp")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rxnfp==0.1.0 not installed (make install adds it with pip install --no-deps)")
    return Path(list(spec.submodule_search_locations)[0]) / "models" / "transformers" / "bert_pretrained"


def test_rxnfp_every_bound_sound_at_real_inputs(tmp_path):
    from harness.analyze.cli import main

    src = _rxnfp_folder()
    model = tmp_path / "rxnfp_bert"
    shutil.copytree(src, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg.setdefault("model_type", "bert")  # the 2020 config predates model_type
    (model / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    rc = main(["--model", str(model), "--text", "C C O . C C ( = O ) O > > C C O C ( C ) = O",
               "--text", "C C ( = O ) Cl . N c 1 c c c c c 1 > > C C ( = O ) N c 1 c c c c c 1",
               "--layers", "0,11", "--out", str(out), "--no-progress"])
    assert rc == 0
    import pandas as pd

    t = pd.read_csv(out / "table.csv")
    assert set(t["layer"]) == {0, 11} and set(t[t["head"] >= 0]["head"]) == {0, 1, 2, 3}
    assert t["sound"].all() and t["converged"].all()
    truth = t[(t["method"] == "truth") & (t["head"] == -1)]["value"]
    assert (truth > 0).all()
