"""Errors every layer may raise (imports nothing from the project, so any module can use them)."""
from __future__ import annotations


class AttnLipError(Exception):
    """Base class of the toolkit's own errors."""


class MissingData(AttnLipError, RuntimeError):
    """A cell needs an input that is not available here (shared data, weights). The runner reports the cell as
    skipped for missing data (a failure exit, with the fix in the summary); the smoke test skips on it.
    `fix`: the one command (or setting) that provides the data, shown in the run's summary."""

    def __init__(self, message: str = "", fix: str = ""):
        super().__init__(message)
        self.fix = fix


class DataNotFound(FileNotFoundError, MissingData):
    """A data file or folder is absent: a FileNotFoundError for callers, MissingData for the runner."""

    def __init__(self, message: str = "", fix: str = ""):
        FileNotFoundError.__init__(self, message)
        self.fix = fix

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnsupportedContext(AttnLipError, ValueError):
    """An experiment cannot run in the requested dtype or on the requested device; raised before computing."""


class CorruptFile(AttnLipError):
    """A stored file (cell, artifact) that cannot be trusted: truncated, edited, wrong key, unsafe content."""


class PluginError(AttnLipError, ValueError):
    """A plug-in (a user's function loaded by name) raised, or returned something that cannot be bound values: the
    user's code, reported in one line naming the plug-in (harness.plugins.guarded)."""
