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
