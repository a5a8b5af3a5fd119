"""What a run consumed, per stream: the ledger's counts as a component of the run record (``run.record``).

Most of the ledger is counted from the plan (``iterators.ledger``): what every rank together has taken up to a
position, the same on every rank. What the plan cannot give back is kept here, and in the state: the totals when
the current epoch (or its edited part) began, so an epoch needs no count of the ones before it; what the run's
skips dropped by then; and the streams a mixture edit removed (``dormant``: their counts, and, stream sampler,
where each stood, to go on from there if it is added back). ``flat`` writes the counts as the dict of numbers a
logger takes.
"""

from __future__ import annotations

import copy

import numpy as np

from babelfeed.plan.totals import FIELDS
from babelfeed.errors import StateError


class Ledger:
    """The ledger's counts kept by a run: per epoch the totals when it began (``start``) and what the skips had
    dropped by then (``skipped``), the counts of streams an edit removed kept with them (``skipped_other``), and
    the removed streams themselves (``dormant``). Counts are int64[3, streams] in the plan's stream order."""

    def __init__(self, streams: int = 0, fields: tuple = FIELDS):
        self.fields = tuple(fields)  # what a dormant stream keeps (an LM run's: samples, tokens, passes)
        zeros = np.zeros((len(FIELDS), streams), np.int64)
        self.start: dict = {1: zeros}
        self.skipped: dict = {1: zeros.copy()}
        self.skipped_other: dict = {}  # stream an edit removed -> its skipped counts
        self.dormant: dict = {}  # stream an edit removed -> {FIELDS..., "rows", "position", "served"}
        self.counts_from = 1  # the epoch the counts begin at (later than 1: an older state without one resumed far on)

    # ------------------------------------------------------------------------------------ component
    def get_state(self, epoch: int, keys: list, start, skipped=None) -> dict:
        """The state's ``ledger`` (``start``: the totals when ``epoch`` began), ``skipped`` (where the run skipped
        anything) and ``dormant`` fields."""
        out = {"ledger": as_state(start, keys)}
        if self.counts_from > 1:
            out["ledger_from"] = self.counts_from
        if skipped is not None:
            out["skipped"] = skipped_state(skipped, keys, self.skipped_other)
        if self.dormant:
            out["dormant"] = copy.deepcopy(self.dormant)
        return out

    def set_state(self, state: dict, epoch: int, keys: list) -> None:
        """Take a state's counts (its ``ledger``, ``skipped`` and ``dormant``), checked; a state without a ledger
        (an older babelfeed's) counts from epoch 1, which the plan gives."""
        self.check(state)
        zeros = np.zeros((len(FIELDS), len(keys)), np.int64)
        self.start = {epoch: from_state(state["ledger"], keys)} if "ledger" in state else {1: zeros}
        self.skipped_other = {}
        if "skipped" in state:
            totals, self.skipped_other = skipped_from_state(state["skipped"], keys)
            self.skipped = {epoch: totals}
        else:
            self.skipped = {1: zeros.copy()}
        self.dormant = copy.deepcopy(state.get("dormant", {}))
        since = state.get("ledger_from", 1) if "ledger" in state else 1
        if type(since) is not int or not 1 <= since <= epoch:
            raise StateError(f"iterator state field 'ledger_from' must be an epoch from 1 to the state's ({epoch}), "
                             f"got {since!r}")
        self.counts_from = since

    def check(self, state: dict) -> None:
        """Refuse a malformed ``dormant`` field (``ledger`` and ``skipped`` are checked against the streams when
        they are read)."""
        FIELDS = self.fields  # noqa: N806  (this ledger's)
        dormant = state.get("dormant", {})
        if not isinstance(dormant, dict):
            raise StateError(f"iterator state field 'dormant' must map removed streams to their position and counts, "
                             f"got {str(dormant)[:200]}")
        for k, v in dormant.items():
            ok = (isinstance(k, str) and isinstance(v, dict) and set(FIELDS) <= set(v)
                  and set(v) <= {"position", "epoch", "rows", "served", "skipped", "skipped_tokens", *FIELDS}
                  and all(type(x) is int and x >= 0 for f, x in v.items() if f != "served")
                  and isinstance(v.get("served", ""), str))
            if not ok:
                raise StateError(f"iterator state field 'dormant' holds {k!r}: {str(v)[:200]}; a removed stream is "
                                 f"{{{', '.join(repr(f) for f in FIELDS)}, 'position'?, 'rows'?: integers >= 0, "
                                 f"'served'?: positions}}")

    # ------------------------------------------------------------------------------------ reporting
    def report(self, totals: np.ndarray, keys: list, rows: np.ndarray, epoch: int, step, prefix: str = "ledger",
               skipped: np.ndarray | None = None) -> dict:
        """:func:`flat` of the counts of streams ``keys`` and of the dormant ones after them (their counts as the
        state kept them: a run's totals never go down when an edit removes a stream)."""
        keys = list(keys)
        extra = [k for k in self.dormant if k not in keys]
        rows = np.concatenate([np.asarray(rows, np.int64), [self.dormant[k].get("rows", 0) for k in extra]])
        if extra:
            totals = np.concatenate([totals, np.array([[self.dormant[k][f] for k in extra] for f in FIELDS],
                                                      np.int64).reshape(len(FIELDS), len(extra))], axis=1)
        keys += extra
        if skipped is not None:
            skipped = np.concatenate([skipped, np.zeros((len(FIELDS), len(keys) - skipped.shape[1]), np.int64)],
                                     axis=1)
            for k, counts in self.skipped_other.items():
                if k in keys:
                    skipped[:, keys.index(k)] += counts
        return flat(totals, keys, rows.astype(np.int64), epoch, step, prefix, skipped=skipped)


def as_state(totals: np.ndarray, keys: list[str]) -> dict:
    """The JSON form kept in an iterator state: ``{field: {stream: count}}``."""
    return {f: {k: int(v) for k, v in zip(keys, totals[i].tolist())} for i, f in enumerate(FIELDS)}


def from_state(ledger, keys: list[str]) -> np.ndarray:
    """The totals of a state's ``ledger`` field, checked: every field, an integer >= 0 per stream of ``keys``."""
    if not isinstance(ledger, dict) or set(ledger) != set(FIELDS):
        raise StateError(f"iterator state field 'ledger' must be {{{', '.join(FIELDS)}}} of {{stream: count}}, got "
                         f"{str(ledger)[:200]}")
    out = np.zeros((3, len(keys)), np.int64)
    for i, f in enumerate(FIELDS):
        counts = ledger[f]
        if not isinstance(counts, dict) or sorted(counts) != sorted(keys):
            have = sorted(counts) if isinstance(counts, dict) else counts
            raise StateError(f"iterator state ledger[{f!r}] must count exactly the streams {keys}, got {have!r}"[:400])
        for j, k in enumerate(keys):
            v = counts[k]
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**62:
                raise StateError(f"iterator state ledger[{f!r}][{k!r}] must be an integer in [0, 2**62), got {v!r}")
            out[i, j] = v
    return out


def skipped_state(totals: np.ndarray, keys: list[str], others: dict) -> dict:
    """The state's ``skipped`` field: ``{field: {stream: count}}`` of the rows the run's skips dropped, for this
    config's streams and (``others``: ``{stream: [3 counts]}``) streams an edit removed."""
    out = as_state(totals, keys)
    for k, counts in others.items():
        for i, f in enumerate(FIELDS):
            out[f][k] = int(counts[i])
    return out


def skipped_from_state(saved, keys: list[str]) -> tuple[np.ndarray, dict]:
    """The totals of a state's ``skipped`` field for streams ``keys`` (0 where it names none), and the counts
    it holds for other streams (an edit removed them), checked."""
    if not isinstance(saved, dict) or set(saved) != set(FIELDS):
        raise StateError(f"iterator state field 'skipped' must be {{{', '.join(FIELDS)}}} of {{stream: count}}, "
                         f"got {str(saved)[:200]}")
    out = np.zeros((3, len(keys)), np.int64)
    others: dict = {}
    index = {k: j for j, k in enumerate(keys)}
    for i, f in enumerate(FIELDS):
        counts = saved[f]
        if not isinstance(counts, dict):
            raise StateError(f"iterator state skipped[{f!r}] must map streams to counts, got {str(counts)[:200]}")
        for k, v in counts.items():
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**62 or not isinstance(k, str):
                raise StateError(f"iterator state skipped[{f!r}][{k!r}] must be an integer in [0, 2**62), got {v!r}")
            if k in index:
                out[i, index[k]] = v
            else:
                others.setdefault(k, [0, 0, 0])[i] = v
    return out, others


def flat(totals: np.ndarray, keys: list[str], rows: np.ndarray, epoch: int, step: int | None,
         prefix: str = "ledger", skipped: np.ndarray | None = None) -> dict:
    """A flat dict of numbers for TensorBoard, W&B or absl logging: per stream ``{prefix}/{stream}/samples``,
    ``src_tokens``, ``tgt_tokens`` and ``passes`` (served samples over the stream's rows, rounded down), and the
    totals ``{prefix}/samples``, ``{prefix}/tokens``, ``{prefix}/epoch`` and ``{prefix}/step``. Once the run
    skipped data (``skipped``: the same shape as ``totals``), per stream ``{prefix}/{stream}/skipped`` and
    ``skipped_tokens`` (source and target), and ``{prefix}/skipped``: samples the skips dropped, never served
    (``samples`` does not count them)."""
    out: dict = {}
    for j, k in enumerate(keys):
        for i, f in enumerate(FIELDS):
            out[f"{prefix}/{k}/{f}"] = int(totals[i, j])
        out[f"{prefix}/{k}/passes"] = int(totals[0, j] // rows[j]) if rows[j] else 0
        if skipped is not None:
            out[f"{prefix}/{k}/skipped"] = int(skipped[0, j])
            out[f"{prefix}/{k}/skipped_tokens"] = int(skipped[1, j] + skipped[2, j])
    out[f"{prefix}/samples"] = int(totals[0].sum())
    out[f"{prefix}/tokens"] = int(totals[1].sum() + totals[2].sum())
    if skipped is not None:
        out[f"{prefix}/skipped"] = int(skipped[0].sum())
    out[f"{prefix}/epoch"] = int(epoch)
    if step is not None:  # (a DataLoader's position counts batches, not the run's steps)
        out[f"{prefix}/step"] = int(step)
    return out


