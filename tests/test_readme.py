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
