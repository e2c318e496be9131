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
