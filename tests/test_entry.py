"""The `attnlip` command dispatches to `analyze` and `run`."""
import pytest

from harness import entry


def test_dispatch(capsys):
    assert entry.main([]) == 2 and "attnlip analyze" in capsys.readouterr().out
    assert entry.main(["nope"]) == 2 and "unknown command" in capsys.readouterr().err
    lines = []
    from harness import cli

    assert cli.main(["--list"], out=lines.append) == 0
    assert entry.main(["run", "--list"]) == 0 and "castin_sqrt_n" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        entry.main(["analyze", "--help"])
    assert e.value.code == 0 and "--model" in capsys.readouterr().out


@pytest.mark.parametrize("cmd", ["analyze", "certify", "run", "data"])
def test_help_checks_no_network_and_prints_no_note(cmd, capsys, monkeypatch):
    """Help answers at once: no network check before it, so no offline note on stderr beside it."""
    from harness import network

    def probe(*a, **k):
        raise AssertionError("the network was checked for --help")

    monkeypatch.setattr(network, "offline_if_unreachable", probe)
    with pytest.raises(SystemExit) as e:
        entry.main([cmd, "--help"])
    cap = capsys.readouterr()
    assert e.value.code == 0 and cap.out.endswith("\n") and cap.err == "", cap.err


@pytest.mark.parametrize("cmd, module", [("analyze", "harness.analyze.cli"), ("certify", "harness.certify.cli"),
                                         ("data", "harness.data.cli")])
def test_ctrl_c_is_one_line_and_status_130(cmd, module, capsys, monkeypatch):
    import importlib

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(module), "main", interrupted)
    monkeypatch.setenv("ATTNLIP_OFFLINE", "1")
    assert entry.main([cmd, "x"]) == 130
    err = capsys.readouterr().err
    assert err == f"attnlip {cmd}: interrupted; nothing more was written\n", err


def test_fetch_to_an_empty_name_is_refused(capsys):
    from harness.data import cli as data_cli

    assert data_cli.cmd_fetch(["alice"], to="") == 2
    assert "--to '' is not a folder name" in capsys.readouterr().err
