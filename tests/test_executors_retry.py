"""The process pool's recovery (harness.run.executors._execute_pool) with a scripted pool: a breaking pool fails every
unfinished future, also one whose worker had already written its cell file, so the retry finds that cell done. This
run's own worker computed it: it counts as computed, whatever the timing of the break (tests/test_harness_runner.py
kills real workers)."""
from harness.run import executors
from harness.run.plan import RunConfig
from harness.run.specs import CellSpec, status_of


def _specs(k=3):
    return [CellSpec(experiment="_x", module="_x", module_file=None, cell={"i": i}, key=f"k{i}", label=f"i={i}",
                     seed=0, dtype="float64", scale="full", device="cpu", cache_dir="/nonexistent", progress=False,
                     threads=1, model_source=None, data_source=None, force=False, bounds=[]) for i in range(k)]


def test_a_cell_finished_as_its_pool_broke_counts_as_computed(monkeypatch, tmp_path):
    rounds = []

    def scripted(specs, jobs, threads, fresh, out, bar):
        rounds.append([s.label for s in specs])
        if len(rounds) == 1:  # the first cell finishes, then the pool breaks with the others in flight
            out.append(status_of(specs[0], "ok"))
            return list(specs[1:])
        out.extend(status_of(s, "elsewhere") for s in specs)  # their files were written before the break
        return []

    monkeypatch.setattr(executors, "_pool_round", scripted)
    cfg = RunConfig(results_dir=tmp_path, progress=False, executor="process", jobs=2)
    out = executors._execute_pool(_specs(), cfg, "test", 1)
    assert [st.status for st in out] == ["ok", "ok", "ok"] and len(rounds) == 2


def test_a_cell_another_runner_finished_keeps_its_status(monkeypatch, tmp_path):
    def scripted(specs, jobs, threads, fresh, out, bar):  # no worker died: nothing retried
        out.extend(status_of(s, "elsewhere") for s in specs)
        return []

    monkeypatch.setattr(executors, "_pool_round", scripted)
    cfg = RunConfig(results_dir=tmp_path, progress=False, executor="process", jobs=2)
    assert [st.status for st in executors._execute_pool(_specs(), cfg, "test", 1)] == ["elsewhere"] * 3
