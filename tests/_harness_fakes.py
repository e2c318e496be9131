"""Throw-away experiments for the harness tests, written to a temp file and loaded from there (not registered
in experiments/). Behaviour is steered by environment variables so spawned workers see the same setting."""
FAKE_SOURCE = '''
import os
import time

from harness.catalog import Experiment, MissingData, experiment


def _count(tag):
    with open(os.environ["ATTNLIP_TEST_COUNTER"], "a") as fh:
        fh.write(tag + "\\n")


@experiment
class FakeSquares(Experiment):
    """Fake: value = n^2 * mult."""

    name = "_fake_squares"
    figures_ref = ["Fake Fig. 0"]
    grid = {"n": [1, 2, 3], "mult": [1.0, 2.0]}
    quick = {"n": [1, 2]}
    test = {"n": [1]}

    def run(self, cell, ctx):
        _count(f"{self.name} n={cell['n']} mult={cell['mult']}")
        time.sleep(float(os.environ.get("ATTNLIP_TEST_SLEEP", "0")))
        if os.environ.get("ATTNLIP_TEST_FAIL") == str(cell["n"]):
            raise RuntimeError(f"boom at n={cell['n']}")
        if os.environ.get("ATTNLIP_TEST_MISSING") == str(cell["n"]):
            raise MissingData("fake data folder absent")
        if os.environ.get("ATTNLIP_TEST_PLUGIN") == str(cell["n"]):
            from harness.errors import PluginError

            raise PluginError("plug-in fake:bound raised ValueError: bad input")
        return [{"value": cell["n"] ** 2 * cell["mult"], "k": k, "ctx_seed": ctx.seed} for k in range(2)]

    def figures(self, table, outdir):
        from harness import plotting

        if os.environ.get("ATTNLIP_TEST_FIGFAIL"):
            raise ValueError("figure bug")

        fig, ax = plotting.figure()
        ax.plot(table["n"], table["value"], "o")
        return plotting.save(fig, outdir, "squares")

    def summary(self, table):
        return f"max value {table['value'].max()}"


@experiment
class FakeSlow(Experiment):
    """Fake: eight cells for the kill/resume test."""

    name = "_fake_slow"
    grid = {"i": list(range(8))}

    def run(self, cell, ctx):
        _count(f"{self.name} i={cell['i']}")
        time.sleep(float(os.environ.get("ATTNLIP_TEST_SLEEP", "0")))
        return [{"i2": cell["i"] * 2}]


@experiment
class FakeKiller(Experiment):
    """Fake: cells that kill their own worker process (as the OOM killer would)."""

    name = "_fake_killer"
    grid = {"i": list(range(6))}

    def run(self, cell, ctx):
        import signal

        _count(f"{self.name} i={cell['i']}")
        marker = os.path.join(os.environ["ATTNLIP_TEST_KILL_DIR"], f"died_{cell['i']}")
        once = str(cell["i"]) == os.environ.get("ATTNLIP_TEST_KILL_ONCE")
        if str(cell["i"]) == os.environ.get("ATTNLIP_TEST_KILL_ALWAYS") or (once and not os.path.exists(marker)):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.2)
        return [{"i2": cell["i"] * 2}]
'''


def write_fake(path, extra="", replace=()):
    """Write the fake experiments module to `path` (with `replace` (old, new) edits) and return the path."""
    src = FAKE_SOURCE
    for old, new in replace:
        assert old in src, old
        src = src.replace(old, new)
    path.write_text(src + extra)
    return path


FAKE_NAMES = ("_fake_squares", "_fake_slow", "_fake_killer")
TEST_ENV = ("ATTNLIP_TEST_SLEEP", "ATTNLIP_TEST_FAIL", "ATTNLIP_TEST_MISSING", "ATTNLIP_TEST_PLUGIN")


def registered_fakes(tmp_path, monkeypatch, stem):
    """Generator for a fixture: write the fakes to tmp_path/<stem>.py, register them, point the counter at
    tmp_path/counter.txt, clear the steering variables; yields (module path, counter path); cleans up after."""
    import sys

    from harness import catalog
    from harness.run import discovery

    mod = write_fake(tmp_path / f"{stem}.py")
    counter = tmp_path / "counter.txt"
    counter.touch()
    monkeypatch.setenv("ATTNLIP_TEST_COUNTER", str(counter))
    for k in TEST_ENV:
        monkeypatch.delenv(k, raising=False)
    discovery.load_all()
    discovery.load_module_file(mod)
    yield mod, counter
    for n in FAKE_NAMES:
        catalog.unregister(n)
    sys.modules.pop(f"_attnlip_ext_{stem}", None)


def registered_reader(tmp_path, monkeypatch, mirror, stem, source, name):
    """Generator for a fixture: `mirror` the only data source (no NLTK data, no network), the experiment `name`
    defined by `source` registered from tmp_path/<stem>.py; yields; unregisters it after."""
    import sys

    from harness import catalog
    from harness.run import discovery

    monkeypatch.setenv("ATTNLIP_DATA", str(mirror))
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "no-nltk"))
    monkeypatch.setenv("ATTNLIP_OFFLINE", "1")
    mod = tmp_path / f"{stem}.py"
    mod.write_text(source)
    discovery.load_all()
    discovery.load_module_file(mod)
    yield
    catalog.unregister(name)
    sys.modules.pop(f"_attnlip_ext_{stem}", None)
