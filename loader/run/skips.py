"""Skipping data after a loss spike: what a run leaves out, from which step on, recorded in its history.

A skip drops samples from the batches that would have held them. It never moves another sample: the plan (which
sample lies in which global batch of which epoch) is the plan of a run that made no skip, so a skip cannot change
what any other step holds, on any world size, before or after a resume. A dropped row leaves its batch:

* a batch of dynamic shape simply has fewer rows (its widths are its remaining rows');
* a batch of a static shape keeps its shape; the dropped rows' slots hold weight-0 copies of its remaining rows,
  as the rows that fill a partial batch always do (the skipped sample's tokens never reach the model);
* a batch left with no row is served *empty*: every ``weight`` 0, ``ntokens`` and ``nsentences`` 0, every ``id``
  -1, its rows weight-0 copies of a sample of the same window that is not skipped (a batch of one row when its
  shape is dynamic, the batch's own static shape otherwise). A training loop should take no optimizer step on a
  step whose tokens are 0 over all ranks (Adam moves the weights even on a zero gradient).

Three kinds, each recorded in the state's ``history`` with the training step after which it took effect (a run
resumed from a later state, on any world size, skips exactly the same rows):

``{"event": "skip", "step": s, "epoch": e, "batch": g, "reason": text, "steps": [a, b], "batches": [[e, lo, hi], ...]}``
    the global batches of training steps ``a`` to ``b - 1``, as this run counts its steps (``"world_size": w``:
    as a run on ``w`` ranks counts them): every row dropped;
``{..., "rows": [{"stream": name, "shard": n, "rows": [[lo, hi], ...]}], "ids": count}``
    samples by id (a batch's ``id``), kept as the records they name, so they stay the same samples across
    mixture edits that renumber ids; dropped wherever they come again from global batch ``g`` of epoch ``e`` on;
``{..., "where": {"stream" | "task" | "corpus": [names], "shard": [n], "rows": [lo, hi]}}``
    every sample matching all the terms given (any of a term's values), from global batch ``g`` of epoch ``e``
    on: a corpus, a task, a shard of one, a range of a shard's records (its ``.idx`` rows).

An LM run's events have ``"sample": n`` (the global sample the skip took effect at) instead of ``epoch`` and
``batch``, ``"samples": [[lo, hi], ...]`` (global samples) for skipped steps, ``"ids": [[lo, hi], ...]`` (global
samples) for ids, and ``"where": {"dataset": [names], "documents": [lo, hi]}``: samples of a dataset, or the
samples holding any document of a range.
"""

from __future__ import annotations

import difflib

import numpy as np

from babelfeed.errors import HistoryError, SkipError


TERMS = ("stream", "task", "corpus", "shard", "rows")
LM_TERMS = ("dataset", "documents")
KINDS = ("steps", "rows", "where", "ids")


def _int(x, smallest: int = 0) -> bool:
    return type(x) is int and x >= smallest


def _pair(x) -> bool:
    return isinstance(x, list) and len(x) == 2 and _int(x[0]) and _int(x[1]) and x[0] < x[1]


def _ranges(x) -> bool:
    return isinstance(x, list) and all(_pair(r) for r in x)


def _names(x) -> bool:
    return isinstance(x, list) and len(x) > 0 and all(isinstance(v, str) for v in x)


SHAPE = ("{'event': 'skip', 'step': int >= 0, 'reason': text, 'epoch': int >= 1, 'batch': int >= 0 (an LM run: "
         "'sample': int >= 0), and one of 'steps': [a, b] with 'batches': [[epoch, lo, hi], ...] (LM: 'samples': "
         "[[lo, hi], ...]), 'rows': [{'stream', 'shard', 'rows': [[lo, hi], ...]}] with 'ids': int, 'ids': [[lo, "
         "hi], ...] (LM), 'where': {term: values}}")


def event_ok(e: dict) -> bool:
    """Whether ``e`` is a well-formed skip event (see the module's docstring)."""
    base = {"event", "step", "reason"}
    if not (_int(e.get("step")) and isinstance(e.get("reason"), str)):
        return False
    lm = "sample" in e
    if lm:
        if not _int(e["sample"]):
            return False
        base |= {"sample"}
    else:
        if not (_int(e.get("epoch"), 1) and _int(e.get("batch"))):
            return False
        base |= {"epoch", "batch"}
    rest = set(e) - base
    if "steps" in e:
        if not (_pair(e["steps"]) and e["steps"][0] >= 1):
            return False
        if lm:
            return rest == {"steps", "samples"} and _ranges(e["samples"])
        return (rest - {"world_size"} == {"steps", "batches"} and isinstance(e["batches"], list)
                and _int(e.get("world_size", 1), 1)
                and all(isinstance(b, list) and len(b) == 3 and _int(b[0], 1) and _pair(b[1:]) for b in e["batches"]))
    if "where" in e:
        w = e["where"]
        if rest != {"where"} or not isinstance(w, dict) or not w:
            return False
        if lm:
            return (set(w) <= set(LM_TERMS) and ("dataset" not in w or _names(w["dataset"]))
                    and ("documents" not in w or _pair(w["documents"])))
        return (set(w) <= set(TERMS) and all(_names(w[k]) for k in ("stream", "task", "corpus") if k in w)
                and ("shard" not in w or isinstance(w["shard"], list) and len(w["shard"]) > 0
                     and all(_int(s) for s in w["shard"]))
                and ("rows" not in w or _pair(w["rows"])))
    if lm:
        return rest == {"ids"} and _ranges(e["ids"]) and len(e["ids"]) > 0
    return (rest == {"rows", "ids"} and _int(e["ids"], 1) and isinstance(e["rows"], list) and len(e["rows"]) > 0
            and all(isinstance(r, dict) and set(r) == {"stream", "shard", "rows"} and isinstance(r["stream"], str)
                    and _int(r["shard"]) and _ranges(r["rows"]) and len(r["rows"]) > 0 for r in e["rows"]))


def as_ranges(values) -> list[list[int]]:
    """Sorted integers as ``[[lo, hi], ...]`` runs (``hi`` exclusive)."""
    v = np.unique(np.asarray(values, np.int64).reshape(-1))
    if not len(v):
        return []
    breaks = np.flatnonzero(np.diff(v) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(v)]])
    return [[int(v[a]), int(v[b - 1]) + 1] for a, b in zip(starts.tolist(), ends.tolist())]


def merged(ranges) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping sorted ``(starts, ends)`` of the union of ``[[lo, hi], ...]``."""
    if not len(ranges):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    r = np.array(sorted((int(a), int(b)) for a, b in ranges), np.int64)
    starts, ends = [int(r[0, 0])], [int(r[0, 1])]
    for a, b in r[1:].tolist():
        if a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return np.array(starts, np.int64), np.array(ends, np.int64)


def in_ranges(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which ``values`` lie in one of the merged ranges."""
    values = np.asarray(values, np.int64)
    if not len(starts):
        return np.zeros(len(values), bool)
    k = np.searchsorted(starts, values, side="right") - 1
    return (k >= 0) & (values < ends[np.maximum(k, 0)])


def range_arg(x, what: str) -> list[int]:
    """A ``range`` (step 1) as ``[lo, hi]``, ``hi`` exclusive. Only a range: a list such as ``[10, 11]`` reads as
    "10 and 11" to one person and as the pair "10 up to 11" to another (and skipped only step 10)."""
    if isinstance(x, range):
        if x.step != 1 or len(x) == 0 or x.start < 0:
            raise SkipError(f"{what} must be a non-empty range with step 1 from 0 or later, got {x!r}")
        return [x.start, x.stop]
    hint = ""
    if isinstance(x, (list, tuple)) and x and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                  for v in x):
        lo, hi = int(min(x)), int(max(x))
        hint = f" (for {lo} to {hi}, both included: range({lo}, {hi + 1})" + (
            "; for the pair [first, stop] that SpikeGuard logs: range(first, stop))" if what == "steps" else ")")
    raise SkipError(f"{what} takes a range, e.g. range(lo, hi) with hi excluded, got {x!r}{hint}")


def which_kind(steps, ids, where, reason) -> str:
    """The one of ``steps``, ``ids`` and ``where`` a skip was given (``skip``'s arguments checked)."""
    given = [k for k, v in (("steps", steps), ("ids", ids), ("where", where)) if v is not None]
    if len(given) != 1:
        raise SkipError(f"skip takes exactly one of steps=, ids=, where=; got {given or 'none'}")
    if not isinstance(reason, str):
        raise SkipError(f"reason must be text, got {reason!r}")
    return given[0]


def step_range(steps, taken: int) -> tuple[int, int]:
    """``steps`` as ``(a, b)``: training steps ``a`` to ``b - 1``, none of them among the ``taken`` ones."""
    a, b = range_arg(steps, "steps")
    if a < 1:
        raise SkipError(f"steps count from 1, got {steps!r}")
    if a <= taken:
        raise SkipError(f"steps {a}..{min(b - 1, taken)} were already taken (this iterator stands after step "
                        f"{taken}): roll back to a state saved before step {a} (set_state), then skip")
    return a, b


def where_terms(where, terms: tuple, whose: str) -> None:
    """Refuse a ``where`` that is not a non-empty dict of ``terms`` (``whose``: whose terms they are)."""
    if callable(where) or not isinstance(where, dict) or not where:
        raise SkipError(f"where is a dict of terms {list(terms)} (a state records it, so no function), got "
                        f"{str(where)[:200]}")
    unknown = sorted(set(where) - set(terms))
    if unknown:
        raise SkipError(f"where has unknown terms {unknown}; {whose} takes {list(terms)}")


def name_list(x, what: str, known: list[str]) -> list[str]:
    """One name or a list of them, each among ``known`` (an unknown one is refused with the closest)."""
    values = [x] if isinstance(x, str) else list(x) if isinstance(x, (list, tuple, set)) else None
    if not values or not all(isinstance(v, str) for v in values):
        raise SkipError(f"where[{what!r}] takes a name or a list of names, got {x!r}")
    for v in values:
        if v not in known:
            close = difflib.get_close_matches(v, known, n=3)
            raise SkipError(f"where[{what!r}]: {v!r} is not a {what} of this run"
                            + (f"; did you mean {', '.join(close)}?" if close else f" (it has {sorted(known)[:10]})"))
    return sorted(set(values), key=values.index)


class Skips:
    """The skips of a run (its history's skip events, in the order made): a component of the run record, and the
    one engine that answers which rows they drop. A translation run's rows are records of its components
    (:meth:`dropped`, :meth:`which`; each sources object's components, which a mixture edit changes, get the
    events compiled once into per-component rules); an LM run's are global samples (:meth:`dropped_samples`,
    :meth:`which_samples`, given the run's own test of a ``where``)."""

    def __init__(self, events=()):
        self.events: list = [dict(e) for e in events]
        self._compiled: dict = {}
        self._single: dict = {}  # event index -> a Skips of that event alone (which())

    def __bool__(self) -> bool:
        return bool(self.events)

    def add(self, event: dict) -> None:
        self.events.append(event)
        self._compiled, self._single = {}, {}

    # ------------------------------------------------------------------------------------ component
    def get_state(self) -> list:
        return [dict(e) for e in self.events]

    def set_state(self, events: list, lm: bool = False, at=None) -> None:
        """Take a state's skip events, checked (``lm``: an LM run's, each at a global sample no later than
        ``at``, its ``consumed_samples``)."""
        self.check(events, lm, at)
        self.events = [dict(e) for e in events]
        self._compiled, self._single = {}, {}

    @staticmethod
    def check(events: list, lm: bool = False, at=None) -> None:
        """Refuse skip events that are not this kind of run's, or that lie past the state's position."""
        for i, e in enumerate(events):
            if not isinstance(e, dict) or not event_ok(e):
                raise HistoryError(f"iterator state field 'history' skip {i} is {str(e)[:200]}; it must be {SHAPE}")
            if lm and "sample" not in e:
                raise HistoryError(f"iterator state field 'history': skip {i} is a translation run's (it names an "
                                   f"epoch and global batch); an LM run's names the global sample it took effect at")
            if lm and isinstance(at, int) and e["sample"] > at:
                raise HistoryError(f"iterator state field 'history': skip {i} took effect at sample {e['sample']}, "
                                   f"past the state's consumed_samples={at}")

    # ------------------------------------------------------------------------------------ LM runs: samples
    def dropped_samples(self, g, where, events: list | None = None) -> np.ndarray:
        """Which of global samples ``g`` the skips (or ``events``) drop, each from the sample it took effect at;
        ``where(terms, g)``: which of ``g`` a skip's ``where`` names (the run's datasets and documents)."""
        g = np.asarray(g, np.int64)
        out = np.zeros(len(g), bool)
        for e in self.events if events is None else events:
            if "samples" in e or "ids" in e:  # (global samples: positions the run had not reached)
                out |= in_ranges(g, *merged(e.get("samples", e.get("ids"))))
                continue
            live = g >= e["sample"]
            if live.any():
                out |= live & where(e["where"], g)
        return out

    def which_samples(self, g, where) -> np.ndarray:
        """Per global sample of ``g``: the index of the first skip that drops it, -1 where none does."""
        g = np.asarray(g, np.int64)
        out = np.full(len(g), -1, np.int64)
        for i, e in enumerate(self.events):
            out[(out < 0) & self.dropped_samples(g, where, [e])] = i
        return out

    @property
    def row_events(self) -> list:
        return [e for e in self.events if "steps" not in e]

    def step_ranges(self) -> list[tuple[int, int, int]]:
        return [tuple(b) for e in self.events if "steps" in e for b in e["batches"]]

    def whole(self, epoch: int, g: int) -> bool:
        """Whether global batch ``g`` of ``epoch`` is a skipped step's (every row dropped)."""
        return any(e == epoch and lo <= g < hi for e, lo, hi in self.step_ranges())

    def in_force(self, epoch: int, g: int) -> int:
        """How many of the row events (ids, where) are in force at global batch ``g`` of ``epoch`` (they take
        effect in the order made)."""
        n = 0
        for e in self.row_events:
            if (e["epoch"], e["batch"]) <= (epoch, g):
                n += 1
        return n

    def _rules(self, sources, n: int):
        """For the first ``n`` row events: per component of ``sources``, 0 (no row dropped), 1 (every row) or 2
        (rows in ranges); and ``(base, starts, ends)``: each component's first record in one numbering of all
        their records, and the code-2 components' merged ranges in that numbering."""
        key = (id(sources), n)
        got = self._compiled.get(key)
        if got is not None and got[0] is sources:
            return got[1], got[2]
        comps = sources.components
        specs = {s.name: s for s in sources.streams}
        code = np.zeros(len(comps), np.int8)
        ranges: dict[int, list] = {}
        by_name = {(c.key, int(c.shard)): i for i, c in enumerate(comps)}
        for e in self.row_events[:n]:
            if "rows" in e:
                for r in e["rows"]:
                    i = by_name.get((r["stream"], r["shard"]))
                    if i is not None and code[i] != 1:
                        code[i] = 2
                        ranges.setdefault(i, []).extend(r["rows"])
                continue
            w = e["where"]
            for i, c in enumerate(comps):
                spec = specs[c.key]
                if ("stream" in w and c.key not in w["stream"]) or ("task" in w and spec.task not in w["task"]) \
                        or ("corpus" in w and spec.key not in w["corpus"]) \
                        or ("shard" in w and int(c.shard) not in w["shard"]):
                    continue
                if "rows" in w:
                    if code[i] != 1:
                        code[i] = 2
                        ranges.setdefault(i, []).append(w["rows"])
                else:
                    code[i] = 1
                    ranges.pop(i, None)
        # the ranges of every code-2 component as one sorted list over all components' records (each component's
        # records numbered from its first id), so a batch's rows are looked up in one search
        base = np.concatenate([[0], np.cumsum([len(c) for c in comps])]).astype(np.int64)
        starts, ends = [], []
        for i, r in sorted(ranges.items()):
            if code[i] == 2:
                a, b = merged(r)
                n = int(base[i + 1] - base[i])
                a, b = np.minimum(a, n), np.minimum(b, n)
                starts.append(base[i] + a)
                ends.append(base[i] + b)
        compiled = (base, np.concatenate(starts) if starts else np.zeros(0, np.int64),
                    np.concatenate(ends) if ends else np.zeros(0, np.int64))
        self._compiled[key] = (sources, code, compiled)
        return code, compiled

    def dropped(self, sources, epoch: int, g: int, comp: np.ndarray, local: np.ndarray) -> np.ndarray | None:
        """Which rows (components ``comp``, records ``local`` of ``sources``) of global batch ``g`` of ``epoch`` the
        skips drop; None when none."""
        if not self.events:
            return None
        if self.whole(epoch, g):
            return np.ones(len(comp), bool)
        n = self.in_force(epoch, g)
        if not n:
            return None
        return self.rows_dropped(sources, n, comp, local)

    def which(self, sources, epoch: int, g: np.ndarray, comp: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Per row (of global batch ``g[i]`` of ``epoch``, component ``comp[i]`` of ``sources``, record
        ``local[i]``): the index in :attr:`events` of the first skip that drops it, -1 where none does (what the
        ledger's report attributes to each skip)."""
        g = np.asarray(g, np.int64)
        out = np.full(len(g), -1, np.int64)
        for i, e in enumerate(self.events):
            free = out < 0
            if not free.any():
                break
            if "steps" in e:
                hit = np.zeros(len(g), bool)
                for ep, lo, hi in e["batches"]:
                    if ep == epoch:
                        hit |= (g >= lo) & (g < hi)
            else:
                if (e["epoch"], e["batch"]) > (epoch, int(g.max(initial=-1))):
                    continue
                live = (epoch > e["epoch"]) | (g >= e["batch"])
                one = self._single.get(i)
                if one is None:
                    one = self._single[i] = Skips([e])
                got = one.rows_dropped(sources, 1, comp, local)
                hit = live & (got if got is not None else False)
            out[free & hit] = i
        return out

    def rows_dropped(self, sources, n: int, comp: np.ndarray, local: np.ndarray) -> np.ndarray | None:
        code, (base, starts, ends) = self._rules(sources, n)
        comp = np.asarray(comp, np.int64)
        c = code[comp]
        out = c == 1
        two = c == 2
        if two.any():
            out[two] = in_ranges(base[comp[two]] + np.asarray(local, np.int64)[two], starts, ends)
        return out if out.any() else None
