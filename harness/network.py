"""Whether the network is there, known quickly: one probe per command, before any library retries a download.

Without a network and without HF_HUB_OFFLINE, Hugging Face's libraries and NLTK's downloader retry every download
with back-off: 47-70 s per command on a cluster node. `offline_if_unreachable()` runs once per process (the entry
points call it first): unless the environment already decides (ATTNLIP_OFFLINE, HF_HUB_OFFLINE, HF_DATASETS_OFFLINE
set to anything), it opens one TCP connection to the hub (HF_ENDPOINT, else huggingface.co; through HTTPS_PROXY /
HTTP_PROXY when one is set) with a short timeout. When that fails it sets ATTNLIP_OFFLINE=1, HF_HUB_OFFLINE=1 and
HF_DATASETS_OFFLINE=1 for this process and its workers (before the hub libraries read them at import), records why
in ATTNLIP_OFFLINE_CHECKED (so later notes say "no network reached", not a variable the user never set) and returns
one line saying so. Everything then resolves from local copies at once: the mirror (ATTNLIP_DATA), the caches,
the package models; a missing item is named with the command that gets it, as with the variables set by hand.

Infrastructure (harness.boundary): it decides whether a download is attempted, never what a resolved source holds;
the resolved model and data sources are key fields of every cell.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Optional, Tuple
from urllib.parse import urlparse

DECIDED = ("ATTNLIP_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
OFFLINE_VARS = ("ATTNLIP_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
# set beside OFFLINE_VARS when the probe set them (the user set none): why the network was judged absent, so every
# later note says that instead of naming a variable the user never set (read by harness.data.hub.offline_reason)
CHECKED = "ATTNLIP_OFFLINE_CHECKED"
TIMEOUT_S = 1.5
_DONE: dict = {}


def endpoint() -> Tuple[str, int]:
    """(host, port) the probe connects to: the proxy when one is set, else the hub endpoint."""
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        if os.environ.get(var):
            u = urlparse(os.environ[var] if "://" in os.environ[var] else "http://" + os.environ[var])
            return u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
    u = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return u.hostname or "", u.port or (443 if u.scheme == "https" else 80)


def probe(timeout: float = TIMEOUT_S) -> Optional[str]:
    """None when a TCP connection to endpoint() opens within `timeout` seconds, else why not (one phrase)."""
    host, port = endpoint()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"{host} does not resolve"
    except socket.timeout:
        return f"no answer from {host}:{port} within {timeout:g} s"
    except OSError as e:
        return f"{host}:{port} unreachable ({e.strerror or e.__class__.__name__})"


def asks_help(argv) -> bool:
    """A command line that only asks for help: no network check, no note (help answers at once)."""
    return any(a in ("-h", "--help") for a in argv)


def offline_if_unreachable(timeout: float = TIMEOUT_S) -> Optional[str]:
    """Probe once per process unless the environment decides; offline: set the offline variables and return the
    note to print, else None."""
    if "note" in _DONE:
        return None
    if any(os.environ.get(v) is not None for v in DECIDED):
        _DONE["note"] = None
        return None
    t0 = time.perf_counter()
    why = probe(timeout)
    if why is None:
        _DONE["note"] = None
        return None
    for v in OFFLINE_VARS:
        os.environ[v] = "1"
    os.environ[CHECKED] = why
    _DONE["note"] = note = (f"note: no network ({why}, checked in {time.perf_counter() - t0:.1f} s): downloads are off "
                            f"for this command, data and models come from local copies (set ATTNLIP_OFFLINE=1 to "
                            f"skip this check, or ATTNLIP_OFFLINE=0 to keep trying downloads)")
    return note
