"""One line, not a traceback, when the command runs in a Python without the project's packages (system `python3`
instead of the venv): which package is missing and the two ways to run inside the venv."""
from __future__ import annotations

import importlib.util
import sys
from typing import Optional

NEEDED = ("torch", "numpy", "pandas", "transformers")


def missing_package() -> Optional[str]:
    """The first package AttnLip needs that this interpreter cannot import, or None."""
    for name in NEEDED:
        if importlib.util.find_spec(name) is None:
            return name
    return None


def require(prog: str) -> None:
    """Exit 2 with one line when a needed package is missing (call before importing anything that needs it)."""
    name = missing_package()
    if name is None:
        return
    print(f"{prog}: error: {name} is not installed in this Python ({sys.executable}). Run inside the project's "
          f"venv: `make install`, then `.venv/bin/python run_all.py ...` or `source .venv/bin/activate` (or use the "
          f"make targets: make quick, make test)", file=sys.stderr)
    sys.exit(2)
