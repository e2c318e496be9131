"""Progress bars off everywhere: run_all.py's --no-progress (or a stderr that is not a terminal) silences the bars
the libraries draw themselves, in this process and in the pool's workers, and restores them afterwards."""
from __future__ import annotations

import contextlib
import os
import sys

PROGRESS_ENV = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")


def _library_bars() -> dict:
    """(disable, enable, is_enabled) of the progress bars of each imported library that draws its own
    (transformers' weight loading, datasets' map/download, huggingface_hub's downloads)."""
    out = {}
    if "transformers" in sys.modules:
        from transformers.utils import logging as tl

        out["transformers"] = (tl.disable_progress_bar, tl.enable_progress_bar, tl.is_progress_bar_enabled)
    if "datasets" in sys.modules:
        import datasets as ds

        out["datasets"] = (ds.disable_progress_bars, ds.enable_progress_bars, ds.is_progress_bar_enabled)
    if "huggingface_hub" in sys.modules:
        from huggingface_hub import utils as hu

        out["huggingface_hub"] = (hu.disable_progress_bars, hu.enable_progress_bars,
                                  lambda: not hu.are_progress_bars_disabled())
    return out


@contextlib.contextmanager
def progress_bars_silenced(silence: bool):
    """Without progress (--no-progress, or stderr not a terminal): no library draws a bar either. The variables
    reach libraries imported later and the pool's worker processes; libraries already imported are switched off
    directly. Everything is restored afterwards."""
    if not silence:
        yield
        return
    saved_env = {k: os.environ.get(k) for k in PROGRESS_ENV}
    before = {name: fns[2]() for name, fns in _library_bars().items()}
    os.environ.update({k: "1" for k in PROGRESS_ENV})
    for fns in _library_bars().values():
        fns[0]()
    try:
        yield
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for name, fns in _library_bars().items():  # one first imported in the block keeps what it read then
            if before.get(name):
                fns[1]()
