"""Exceptions raised for bad input.

Every message names the file (and, where there is one, the record) and what is wrong with it, so that a
user with ten thousand shards can find the broken one from the error alone.
"""

from __future__ import annotations

import os


class BabelfeedError(Exception):
    """The root of babelfeed's own errors. The errors of bad input (a config, a file, a state) are also
    ``ValueError``, so code that caught ValueError keeps working."""


class FormatError(BabelfeedError, ValueError):
    """A file that is not what babelfeed expected. ``path`` names the file.

    One argument is the whole message (path None): that is how a copy is made where the error crosses a process
    (pickling, torch's DataLoader re-raising a worker's error), so it keeps its type on every path."""

    def __init__(self, path: str | os.PathLike | None, message: str | None = None):
        if message is None:
            path, message = None, str(path)
        self.path = None if path is None else os.fspath(path)
        self.reason = message
        super().__init__(f"{self.path}: {message}" if self.path else message)

    def __reduce__(self):
        return type(self), (self.path, self.reason)


class BadMagicError(FormatError):
    """The file does not start with a known index magic."""


class UnsupportedVersionError(FormatError):
    """The index header carries a version this reader does not know."""


class UnknownDtypeError(FormatError):
    """The dtype code in the header is not in the table of the detected format."""


class TruncatedFileError(FormatError):
    """A file is shorter than its header or index says it must be."""


class InconsistentIndexError(FormatError):
    """Sizes, pointers or document indices contradict each other (negative, overlapping, out of range)."""


class SideMismatchError(FormatError):
    """The two sides of a translation direction disagree on the number of sentences."""


class DataChangedError(FormatError):
    """The data a running job reads was replaced under it (a folder renamed into place, ``binarize
    --overwrite``): the rest of the run would not be the run its plan and state describe."""


class HistoryError(BabelfeedError, ValueError):
    """A state's history that is not well formed (edited by hand, or from another program): the message names the
    event and what it should be (``babelfeed.run.history``)."""


class Notice(UserWarning):
    """Something babelfeed did that the user should hear once, not an error: an accepted mixture edit, a resume
    that repeats or skips samples. ``warnings.filterwarnings("ignore", category=Notice)`` silences them."""


def user_frame() -> int:
    """The ``stacklevel`` of ``warnings.warn``, called by the caller of this function, that names the first frame
    outside babelfeed (the user's line that led to the warning, whichever adapter it went through)."""
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    ours = (here, os.path.join(os.path.dirname(here), "adapters"))
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(ours):
        frame, level = frame.f_back, level + 1
    return level


class ConfigError(BabelfeedError, ValueError):
    """A config value (or a combination of values) that babelfeed cannot run with; the message names the key."""


class UnsupportedDtypeError(BabelfeedError, ValueError):
    """A builder was asked to write a dtype that the target format cannot encode."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (what Slurm, Kubernetes and ``timeout`` send), raised where the signal lands so that it cleans up
    as Ctrl-C does: worker processes stopped, temporary folders removed, finished work kept."""


def terminate_as_interrupt() -> None:
    """Make SIGTERM raise :class:`Terminated` in the main thread, where SIGTERM still has its default action
    (a handler of the caller's own is left alone)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def _raise(signum, frame):
            raise Terminated()

        signal.signal(signal.SIGTERM, _raise)


class MissingExtraError(BabelfeedError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it
    (``pip install 'babelfeed[plot]'``). The command line reports it as a user error (exit 2)."""
