"""Every error babelfeed raises on purpose, by what it is about.

Every message names the file (and, where there is one, the record) and what is wrong with it, so that a
user with ten thousand shards can find the broken one from the error alone.

An error a user can cause is a :class:`BabelfeedError`; an error of any other type is a bug of babelfeed's (the
command line reports it as one). The families::

    BabelfeedError
        UsageError (ValueError)          a call babelfeed cannot make with these arguments
            UsageTypeError (TypeError)   ... an argument of the wrong type
            OutOfRange (IndexError)      ... a step, batch or record that does not exist
            CallOrderError (RuntimeError) ... a call at a time the object cannot take it (a pass running, closed)
        ConfigError (ValueError)         a config value, or a combination of values, that cannot run
            ConfigTypeError (TypeError), UnknownConfigKey (KeyError, AttributeError)
        DataError (ValueError)           data that cannot be served as asked (none for a split, a sample no budget fits)
            FormatError                  a file that is not what it should be (and its kinds)
            TextInputError, BinarizeError  raw text that binarize refuses
        StateError (ValueError)          a saved state that is not a state, or does not fit the run
            StateMismatch, HistoryError, SkipError
        StoreError (OSError)             an object store or the host's fetcher failing a request
        WorkerDied (RuntimeError)        a worker process died more often than the engine retries
        MissingExtraError (ImportError)  an optional dependency not installed

Each derives from the builtin type that code written before these types caught (``ValueError`` above all), and
each is made from its message alone, so that it keeps its type where it crosses a process (pickling, torch's
DataLoader re-raising a worker's error). :class:`InternalError` is the one error here that is not the user's: an
invariant of babelfeed's own that failed.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading


class BabelfeedError(Exception):
    """The root of the errors a user can cause (a config, a file, a state, a call): the message says what to fix.
    The errors of bad input are also ``ValueError``, so code that caught ValueError keeps working."""


class InternalError(RuntimeError):
    """An invariant of babelfeed's own that failed: a bug to report, never the user's mistake."""


class UsageError(BabelfeedError, ValueError):
    """A call babelfeed cannot make with the arguments given: a value out of its range, a step that was never
    taken, an option that does not apply. The message names the argument."""


class UsageTypeError(UsageError, TypeError):
    """An argument of the wrong type (``set_state("state.json")`` where the state dict goes)."""


class OutOfRange(UsageError, IndexError):
    """A step, batch, window or record that does not exist (``it[10**9]``, ``dataset[len(dataset)]``)."""


class CallOrderError(BabelfeedError, RuntimeError):
    """A call the object cannot take now: a loader asked for its state while a pass runs, a closed iterator, a
    builder already finalized, a run that is over."""


class ConfigError(BabelfeedError, ValueError):
    """A config value (or a combination of values) that babelfeed cannot run with; the message names the key."""


class ConfigTypeError(ConfigError, TypeError):
    """A config value of the wrong type, set in Python (``config.batching.max_tokens = "4096"``)."""


class UnknownConfigKey(ConfigError, KeyError, AttributeError):
    """A key a locked config does not have, set in Python (``config.batching.max_token = 4096``)."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DataError(BabelfeedError, ValueError):
    """Data that cannot be served as asked: no data for a split or a direction, a sample longer than every
    budget, a token id past the dictionary, a corpus a filter leaves empty. The message names the corpus."""


class FormatError(DataError):
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


class TextInputError(DataError):
    """An input file that cannot be read as the text it claims to be (bad compression, a wrong suffix)."""


class BinarizeError(DataError):
    """Input that binarize refuses: mismatched line counts, missing sides, a policy set to 'error'."""


class StateError(BabelfeedError, ValueError):
    """A checkpoint that holds no babelfeed state, or a state that is not well formed (edited by hand, damaged,
    from another program): the message names the field."""


class StateMismatch(StateError):
    """A state saved with other data or settings than this iterator's (``set_state(state,
    mixture_change="allow")`` takes an edited mixture)."""


class HistoryError(StateError):
    """A state's history that is not well formed (edited by hand, or from another program): the message names the
    event and what it should be (``babelfeed.run.history``)."""


class SkipError(StateError):
    """A skip that cannot be made: steps already served, an unknown corpus, a malformed id."""


class StoreError(BabelfeedError, OSError):
    """An object store or the host's fetcher failed a request: the message names the object (and the range), never
    a credential (a URL's ``user:password@`` is replaced by ``***@``)."""

    def __init__(self, *args):
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it (``scheme://user:secret@host``) replaced by ``***``: an
    endpoint may carry them, and messages and logs never do."""
    if "@" not in text:
        return text
    return _USERINFO.sub(r"\1***@", text)


class WorkerDied(BabelfeedError, RuntimeError):
    """A worker process died while running a task (killed, out of memory) more often than the engine retries."""


class Notice(UserWarning):
    """Something babelfeed did that the user should hear once, not an error: an accepted mixture edit, a resume
    that repeats or skips samples. ``warnings.filterwarnings("ignore", category=Notice)`` silences them."""


class StoreNotice(Notice):
    """Something an object-store folder held that babelfeed skipped (a stray key), said once when it is mirrored."""


class UpsamplingNotice(Notice):
    """Directions served many times their data in an epoch (``mixing.warn_upsample``), said once when a run is
    built: ``warnings.filterwarnings("ignore", category=UpsamplingNotice)`` silences it alone."""


def user_frame() -> int:
    """The ``stacklevel`` of ``warnings.warn``, called by the caller of this function, that names the first frame
    outside babelfeed (the user's line that led to the warning, whichever adapter it went through)."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = (here, os.path.join(os.path.dirname(here), "adapters"))
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(ours):
        frame, level = frame.f_back, level + 1
    return level


class UnsupportedDtypeError(UsageError):
    """A builder was asked to write a dtype that the target format cannot encode."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (what Slurm, Kubernetes and ``timeout`` send), raised where the signal lands so that it cleans up
    as Ctrl-C does: worker processes stopped, temporary folders removed, finished work kept."""


def terminate_as_interrupt() -> None:
    """Make SIGTERM raise :class:`Terminated` in the main thread, where SIGTERM still has its default action
    (a handler of the caller's own is left alone)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def _raise(signum, frame):
            raise Terminated()

        signal.signal(signal.SIGTERM, _raise)


class MissingExtraError(BabelfeedError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it
    (``pip install 'babelfeed[plot]'``). The command line reports it as a user error (exit 2)."""
