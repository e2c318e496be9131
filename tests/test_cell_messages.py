"""The runner's two messages (harness.run.specs): frozen dataclasses in the runner's process, plain JSON dicts across
process and Slurm boundaries."""
import dataclasses
import json

import pytest

from harness.run.specs import CellSpec, CellStatus, lost, status_of


def test_cell_messages_are_frozen_and_cross_boundaries_as_plain_dicts():
    """CellSpec / CellStatus are frozen dataclasses here and plain JSON dicts on the way to a worker and back;
    a message that does not fit says which fields are missing or unknown."""
    spec = CellSpec(experiment="e", module="m", module_file=None, cell={"n": 2}, key="k", label="n=2", seed=0,
                    dtype="float64", scale="test", device="cpu", cache_dir="/tmp/c", progress=False, threads=None,
                    model_source=None, data_source=None, force=False, bounds=[])
    sent = spec.to_dict()
    assert json.loads(json.dumps(sent)) == sent and CellSpec.from_dict(sent) == spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.key = "other"
    assert spec.but(threads=2).threads == 2 and spec.threads is None
    st = status_of(spec, "ok", wall_s=1.5, n_rows=3)
    assert st.to_dict() == {"experiment": "e", "key": "k", "label": "n=2", "status": "ok", "wall_s": 1.5, "n_rows": 3}
    assert CellStatus.from_dict(st.to_dict()) == st
    assert lost(spec, "gone").error == "gone" and lost(spec, "gone").status == "failed"
    with pytest.raises(ValueError, match=r"missing \['status'\], unknown \['colour'\]"):
        CellStatus.from_dict({"experiment": "e", "key": "k", "label": "l", "colour": 1})
