"""The README's Python snippet runs as written (so it cannot drift from the API)."""
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_snippet_runs():
    from harness.bounds import registry

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python snippet"
    try:
        for code in blocks:
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    finally:
        if "my_bound" in registry.bound_names():
            registry.unregister_bound("my_bound")


def _commands():
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            cmd = line.split("  #")[0].split(" # ")[0].strip()
            if cmd:
                yield cmd


def test_readme_shell_commands_name_real_targets_and_options():
    """Every command of the README's shell blocks runs as written as far as a test can tell without running it:
    make targets exist, and every run_all.py / attnlip command line parses with its own parser (an option renamed
    or removed fails here)."""
    import shlex

    from harness import cli
    from harness.analyze import cli as analyze_cli
    from harness.certify import cli as certify_cli
    from harness.data import cli as data_cli

    makefile = (README.parent / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.M))
    parsers = {("python", "run_all.py"): cli.build_parser, ("attnlip", "run"): cli.build_parser,
               ("attnlip", "analyze"): analyze_cli.parser, ("attnlip", "certify"): certify_cli.parser,
               ("attnlip", "data"): data_cli._parser}
    seen = set()
    for cmd in _commands():
        words = shlex.split(cmd)
        if words[0] == "make":
            assert words[1] in targets, f"README: `{cmd}`: no target {words[1]!r} in the Makefile"
            seen.add("make")
        elif tuple(words[:2]) in parsers:
            try:
                parsers[tuple(words[:2])]().parse_args(words[2:])
            except SystemExit as e:
                raise AssertionError(f"README: `{cmd}` does not parse") from e
            seen.add(words[0])
        else:
            assert cmd == "source .venv/bin/activate", f"README: `{cmd}` is not checked here: add its parser"
    assert seen == {"make", "python", "attnlip"}
