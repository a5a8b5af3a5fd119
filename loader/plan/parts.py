"""A run continued mid-epoch under another plan: where every stream stands after a mixture edit.

An edit (other weights, temperature, corpora added or removed, other batching) takes effect at the next step. The
planning window being served was planned with the old settings: its batches already served stay served, and its
rows not yet served go back to their streams. So at the edit every stream is *rewound* to where the window began
reading it, and the positions of the window's rows that were served are kept as ``served``: reading the stream
again skips them. Over the whole run a stream's rows then come in its own order, none lost and none repeated.

A stream's *positions* are those of its sequence in the epoch:

* stratified and concat samplers: the epoch's draw of the corpus (``count`` rows, ``mixing.StratifiedDraw``) and,
  past its end, an extension that cycles the corpus in keyed passes (an edit that raises a corpus's share reads
  on there); a corpus the epoch's draw did not have starts on the extension;
* stream sampler: the endless stream itself (``mixing.StreamDraw``), positions since training began.

:class:`Part` is what a planner needs to plan the rest of an epoch after an edit: the global batch it starts at,
the samples left, every stream's position and served positions, and (stratified) the epoch's first draw.
:func:`part_at` derives it from the planner that was serving, at the edit's global batch. Plain integers, so the
state carries it (``encode``/``decode`` keep a set of positions small).
"""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass, field

import numpy as np

from babelfeed.errors import StateError, UsageError
from babelfeed.permute import permute
from babelfeed.plan.mixing import StratifiedDraw, StreamDraw, stratified_counts, stream_rows
from babelfeed.plan.samples import EpochSetup
from babelfeed.sources.sources import Direction


def available(position: int, served: np.ndarray, x) -> np.ndarray:
    """The positions of a stream's ``x``-th unread rows (0-based) from ``position`` on, skipping ``served``
    (sorted positions already read). Vectorised: one search over the served positions."""
    x = np.asarray(x, np.int64)
    if served is None or not len(served):
        return position + x
    ahead = served[served >= position]
    if not len(ahead):
        return position + x
    # the k-th served position stands (ahead[k] - position - k) unread rows after ``position``
    gaps = ahead - position - np.arange(len(ahead), dtype=np.int64)
    return position + x + np.searchsorted(gaps, x, side="right")


def after(position: int, served, last) -> tuple[int, np.ndarray]:
    """A stream's position and served positions once it has read up to position ``last`` (None: nothing read):
    the served positions right after it are passed too, and those behind it dropped."""
    served = np.zeros(0, np.int64) if served is None else np.asarray(served, np.int64)
    if last is None:
        return int(position), served
    nxt = int(last) + 1
    served = served[served >= nxt]
    if len(served) and served[0] == nxt:  # a run of served positions nxt, nxt + 1, ...: passed
        k = int(np.searchsorted(served - np.arange(len(served), dtype=np.int64), nxt, side="right"))
        nxt, served = nxt + k, served[k:]
    return nxt, served


class ExtendedDraw:
    """A corpus's rows in an epoch after an edit: positions below ``count`` are the epoch's draw (``base``: a
    ``StratifiedDraw``, or None for rows in order); from ``count`` on, first the rows that draw's remainder left
    out (a stratified draw of ``q n + r`` takes ``r`` rows a time more: the other ``n - r`` come next, so every row
    is read ``q + 1`` times before any a ``q + 2``-th), then keyed passes over the corpus (``StreamDraw`` on
    ``extension_key``). ``x``-numbering starts at ``position`` and skips ``served``."""

    def __init__(self, n: int, count: int, base, extension_key: tuple, position: int = 0, served=None):
        self.n, self.count, self.base = int(n), int(count), base
        self.extension = StreamDraw(n, extension_key)
        self.position = int(position)
        self.served = np.zeros(0, np.int64) if served is None else np.asarray(served, np.int64)

    def positions(self, x) -> np.ndarray:
        return available(self.position, self.served, x)

    def rows(self, x) -> np.ndarray:
        pos = self.positions(x)
        out = np.empty_like(pos)
        low = pos < self.count
        if low.any():
            out[low] = self.base.rows(pos[low]) if self.base is not None else pos[low]
        if (~low).any():
            k = pos[~low] - self.count
            rest = self.n - self.base.r if isinstance(self.base, StratifiedDraw) else 0
            high = np.empty_like(k)
            left = k < rest
            if left.any():  # the rows the draw's remainder left out, in its own order
                high[left] = permute(self.base.r + k[left], self.n, self.base.extra_key)
            if (~left).any():
                high[~left] = self.extension.rows(k[~left] - rest)
            out[~low] = high
        return out


@dataclass
class Part:
    """The rest of epoch ``epoch`` from global batch ``batch`` on, as a planner of the edited run plans it.

    ``samples``: the samples left in the epoch (the edited mixture's epoch size times the share of the epoch not
    yet planned, ``1 - done``); ``positions`` and ``served``: per stream name, where its sequence goes on and the
    positions after that already served; ``base`` (stratified): per stream name the epoch's first draw,
    ``(count, salt)`` (``salt``: "mix", "concat", or None for rows in order), and ``left`` and ``share``: the
    draws the plan before the edit still had for it in the epoch, and its probability there (so an edit that
    keeps a corpus's share keeps its count: the part scales ``left`` by the change of share); ``batches``
    (stream sampler): global batches since training began at the part's first batch."""

    epoch: int
    batch: int
    samples: int
    done: float
    positions: dict
    served: dict = field(default_factory=dict)
    base: dict = field(default_factory=dict)
    batches: int = 0
    left: dict = field(default_factory=dict)
    share: dict = field(default_factory=dict)
    returned: int = 0  # (a handoff's: rows of the window in progress that went back to their streams)

    def to_state(self) -> dict:
        out = {"epoch": int(self.epoch), "batch": int(self.batch), "samples": int(self.samples),
               "done": float(self.done), "positions": {k: int(v) for k, v in self.positions.items()},
               "served": {k: encode(v) for k, v in self.served.items() if len(v)}}
        if self.base:
            out["base"] = {k: [int(c), s, int(self.left.get(k, 0)), float(self.share.get(k, 0.0))]
                           for k, (c, s) in self.base.items()}
        else:
            out["batches"] = int(self.batches)
        return out

    @classmethod
    def from_state(cls, d) -> "Part":
        ok = (isinstance(d, dict) and {"epoch", "batch", "samples", "done", "positions", "served"} <= set(d)
              and set(d) <= {"epoch", "batch", "samples", "done", "positions", "served", "base", "batches"}
              and all(type(d[k]) is int and d[k] >= 0 for k in ("epoch", "batch", "samples")) and d["epoch"] >= 1
              and isinstance(d["done"], (int, float)) and not isinstance(d["done"], bool) and 0 <= d["done"] <= 1
              and isinstance(d["positions"], dict) and isinstance(d["served"], dict)
              and all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in d["positions"].items())
              and all(isinstance(k, str) and isinstance(v, str) for k, v in d["served"].items()))
        base = d.get("base", {}) if isinstance(d, dict) else None
        ok = ok and isinstance(base, dict) and all(
            isinstance(k, str) and isinstance(v, list) and len(v) == 4 and type(v[0]) is int and v[0] >= 0
            and v[1] in ("mix", "concat", None) and type(v[2]) is int and v[2] >= 0
            and isinstance(v[3], (int, float)) and not isinstance(v[3], bool) and 0 <= v[3] <= 1
            for k, v in base.items())
        if ok and "base" not in d:
            ok = type(d.get("batches")) is int and d["batches"] >= 0
        if not ok:
            raise StateError(f"iterator state field 'part' (where an edited epoch goes on) is not well formed: "
                             f"{str(d)[:300]}")
        served = {}
        for k, v in d["served"].items():
            try:
                served[k] = decode(v)
            except ValueError:
                raise StateError(f"iterator state field part['served'][{k!r}] is not a set of positions "
                                 f"(edited or damaged)") from None
        return cls(d["epoch"], d["batch"], d["samples"], float(d["done"]), dict(d["positions"]), served,
                   {k: (int(v[0]), v[1]) for k, v in base.items()}, int(d.get("batches", 0)),
                   {k: int(v[2]) for k, v in base.items()}, {k: float(v[3]) for k, v in base.items()})


def encode(positions: np.ndarray) -> str:
    """Sorted positions as text: deltas, compressed (a window's served rows are dense: a few bits each)."""
    p = np.asarray(positions, np.int64)
    deltas = np.diff(p, prepend=0).astype("<u8")
    return base64.b64encode(zlib.compress(deltas.tobytes(), 6)).decode("ascii")


def decode(text: str) -> np.ndarray:
    try:
        raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    except Exception:
        raise StateError("not an encoded set of positions") from None
    if len(raw) % 8:
        raise StateError("not an encoded set of positions")
    p = np.cumsum(np.frombuffer(raw, "<u8").astype(np.int64))
    if len(p) and (p[0] < 0 or (np.diff(p) <= 0).any()):
        raise StateError("not an encoded set of positions")
    return p


def direction_rows(directions: list[Direction], s) -> np.ndarray:
    """The row of each planned sample in its direction's row space (its component's offset plus its row there)."""
    offset = {}
    for d in directions:
        for i, c in enumerate(d.component_ids):
            offset[int(c)] = int(d.offsets[i])
    comp = np.asarray(s.comp, np.int64)
    table = np.zeros(int(comp.max(initial=0)) + 1, np.int64)
    for c, o in offset.items():
        if c < len(table):
            table[c] = o
    return table[comp] + np.asarray(s.local, np.int64)


def returned(which: np.ndarray, rows: np.ndarray, back_which: np.ndarray, back_rows: np.ndarray) -> np.ndarray:
    """Which of a window's draws (stream ``which``, row ``rows``, in reading order) go back to their streams: for
    each (stream, row), as many of its draws as the unserved batches hold of it (``back_*``), the first ones read."""
    if not len(which) or not len(back_which):
        return np.zeros(len(which), bool)
    key = np.asarray(which, np.int64) << 40 | np.asarray(rows, np.int64)
    back = np.asarray(back_which, np.int64) << 40 | np.asarray(back_rows, np.int64)
    values, counts = np.unique(back, return_counts=True)
    at = np.minimum(np.searchsorted(values, key), len(values) - 1)
    found = values[at] == key
    drawn = np.bincount(at[found], minlength=len(values))
    out = found.copy()
    over = drawn > counts  # (a row drawn more often than the unserved batches hold it: a stream read past a pass)
    if over.any():  # only the first ``counts`` draws of such a row, in reading order, go back
        sel = np.flatnonzero(found & over[at])
        order = sel[np.argsort(key[sel], kind="stable")]
        k = key[order]
        first = np.concatenate([[True], k[1:] != k[:-1]])
        rank = np.arange(len(k)) - np.maximum.accumulate(np.where(first, np.arange(len(k)), 0))
        out[order] = rank < counts[at[order]]
    return out


def by_stream(which: np.ndarray, values: np.ndarray):
    """``(stream, its values)`` for every stream in ``which``, the values in their order (one sort, no pass per
    stream: a window holds a thousand streams)."""
    order = np.argsort(which, kind="stable")
    w, v = which[order], values[order]
    cuts = np.flatnonzero(np.diff(w)) + 1
    for ws, vs in zip(np.split(w, cuts), np.split(v, cuts)):
        if len(ws):
            yield int(ws[0]), vs


def merge(a, b) -> np.ndarray:
    """The sorted union of two sets of positions."""
    b = np.asarray(b, np.int64)
    if a is None or not len(a):
        return b if len(b) < 2 or (np.diff(b) > 0).all() else np.unique(b)  # (a stream's reads: in order)
    if b is None or not len(b):
        return np.asarray(a, np.int64)
    return np.union1d(a, b)


def remainder(done: float, total: int) -> int:
    """Samples left of an epoch of ``total`` samples once the share ``done`` is planned."""
    return max(int(round((1.0 - done) * total)), 0)


def counts(probs, samples: int) -> np.ndarray:
    return stratified_counts(probs, samples)


def extension_key(seed: int, epoch: int, key: str) -> tuple:
    return (seed, "extend", epoch, key)


def base_draw(n: int, count: int, salt, seed: int, epoch: int, key: str):
    """The epoch's first draw of a corpus (see :class:`Part`'s ``base``)."""
    if not count or salt is None:
        return None
    return StratifiedDraw(n, count, (seed, salt, epoch, key))


class PartPlanning:
    """The planner's side of a run continued after an edit: a part of an epoch that begins at a global batch
    other than 0 (``part``), every stream's served positions ahead of it (``served_ahead``, stream sampler: they
    last until the stream reads past them), and the handoff an edit takes from the planner serving before it.

    A part of :class:`~babelfeed.plan.planner.EpochPlanner`; uses its ``setup``, ``window``, ``locate`` and stream
    planning."""

    part: Part | None = None
    served_ahead: dict = {}  # stream index -> sorted positions already served, at or after its position

    def first_batch(self, epoch: int) -> int:
        """The first global batch of ``epoch`` this planner plans (0, or where its part begins)."""
        p = self.part
        return p.batch if p is not None and p.epoch == epoch else 0

    def salt(self):
        """What keys an epoch's first draw of a corpus (``Part.base``): "mix", "concat", or None (rows in order)."""
        o = self.opts
        if self.sampler.name == "concat":
            return "concat" if o.shuffle and o.compat != "fairseq" else None
        return "mix"

    def can_hand_off(self) -> str | None:
        """Why this planner's run cannot be continued mid-epoch by another plan (None: it can)."""
        if self.opts.compat == "fairseq" or self.sampler.name == "fairseq":
            return ("fairseq-compatible sampling (compat='fairseq' or mixing.sampler='fairseq') draws each epoch "
                    "as fairseq does, and its streams hold no position an edited mixture could go on from, at an "
                    "epoch's start or inside it. To change the mixture of this run: resume the edited config with "
                    "set_state(state, mixture_change='keep_position') (this config's plan at the state's epoch and "
                    "batch, said out loud), or start a new run; a run that will be edited needs compat='none' and "
                    "mixing.sampler 'stratified' (the default) or 'stream' from its start")
        return None

    # ------------------------------------------------------------------------------------------- the edit
    def window_positions(self, epoch: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(stream, position, row)`` of every draw of window w of ``epoch``, in reading order (each stream's
        draws in the order of its sequence)."""
        setup = self.setup(epoch)
        if self.sampler.streams:
            self.window(epoch, w)  # (its counts and mark)
            mark, take = setup.stream[w], setup.window_counts[w]
            live = np.flatnonzero(take)
            which = np.repeat(live, take[live]).astype(np.int64)
            pos = self._stream_positions(mark.positions, take, live)  # (the window's own reads, as planned)
            return which, pos, stream_rows(setup.draws, which, pos)
        dirs, rows, spans = self._window_slice(setup, w)
        which = self._directions(dirs, spans).astype(np.int64)
        lo = self._slice_bounds(setup, w)[0]
        pos = np.empty(len(rows), np.int64)
        for d, a, b in spans:
            x = np.arange(lo[d], lo[d] + (b - a), dtype=np.int64)
            draw = setup.draws[d]
            pos[a:b] = draw.positions(x) if isinstance(draw, ExtendedDraw) else x
        return which, pos, np.asarray(rows, np.int64)

    def _slice_bounds(self, setup, w: int) -> tuple[np.ndarray, np.ndarray]:
        """Per direction, the positions ``[lo, hi)`` of its epoch sequence (x-numbering) window w takes."""
        total = setup.total
        size = self.opts.window if self.opts.window and setup.num_windows > 1 else total
        lo_pos, hi_pos = w * size, min((w + 1) * size, total)
        c = setup.counts.tolist()
        lo = np.array([n * lo_pos // total if total else 0 for n in c], dtype=np.int64)
        hi = np.array([n * hi_pos // total if total else 0 for n in c], dtype=np.int64)
        return lo, hi

    def _in_part(self, epoch: int) -> bool:
        return self.part is not None and self.part.epoch == epoch

    def _stream_position(self, setup, d: int, x: int) -> int:
        """Stratified: the position of direction d's x-th draw of the epoch (skipping served ones)."""
        draw = setup.draws[d]
        if isinstance(draw, ExtendedDraw):
            return int(draw.positions(np.array([x]))[0])
        if self._in_part(setup.epoch):  # (a corpus this part does not draw: where it stood)
            return int(self.part.positions.get(self.keys[d], 0))
        return int(x)

    def handoff(self, epoch: int, g: int) -> Part:
        """Where every stream stands at global batch ``g`` of ``epoch`` (the first batch not served), for a plan
        that continues the run from there: a :class:`Part` (its ``samples`` left for the new plan to size). At a
        window's first batch nothing is served ahead; inside a window, every stream goes back to where the window
        began reading it and the window's served rows are kept as served. At the epoch's end (``g`` past its last
        batch) it is the next epoch's start."""
        why = self.can_hand_off()
        if why:
            raise UsageError(why)
        keys = list(self.keys)
        first = self.first_batch(epoch)
        if g < first:
            raise UsageError(f"global batch {g} of epoch {epoch} was planned by an earlier part of the run")
        where = self.locate(epoch, g)
        if where is None:  # the epoch is over: the next one starts
            if self.sampler.streams:
                positions, batches = self.epoch_start(epoch + 1)
                return Part(epoch + 1, 0, -1, 0.0, dict(zip(keys, positions.tolist())),
                            self._served_by_key(positions), batches=int(batches))
            return Part(epoch + 1, 0, -1, 0.0, {})
        w, j = where
        setup = self.setup(epoch)
        phase_done = self.part.done if self.part is not None and self.part.epoch == epoch else 0.0
        if self.sampler.streams:
            mark = self.stream_mark(epoch, w)
            start = {d: int(mark.positions[d]) for d in range(len(keys))}
            before, total = mark.sample, setup.samples
            batches = int(mark.batches) + g - self.window_start(epoch, w)
        else:
            lo, _ = self._slice_bounds(setup, w)
            start = {d: self._stream_position(setup, d, int(lo[d])) for d in range(len(keys))}
            before, total = int(lo.sum()), setup.total
            batches = 0
        served = {d: (s[s >= start[d]] if s is not None else None) for d, s in
                  ((d, self._served_of(setup, d)) for d in range(len(keys)))}
        consumed = returned_rows = 0
        if j:  # inside the window: its served rows stay served, its other rows go back
            which, pos, rows = self.window_positions(epoch, w)
            win = self.window(epoch, w)
            idx = win.batch_rows(np.arange(j, len(win)))
            back = returned(which, rows, win.samples.direction[idx].astype(np.int64),
                            direction_rows(setup.directions, win.samples[idx]))
            used = ~back
            consumed = int(used.sum())
            returned_rows = int(back.sum())
            for d, p in by_stream(which[used], pos[used]):
                served[d] = merge(served[d], p)
        done = phase_done + (1.0 - phase_done) * (before + consumed) / max(total, 1)
        part = Part(epoch, g, -1, min(done, 1.0), {keys[d]: start[d] for d in range(len(keys))},
                    {keys[d]: s for d, s in served.items() if s is not None and len(s)}, batches=batches,
                    returned=returned_rows)
        if not self.sampler.streams:
            read = lo.copy()  # each corpus's draws read (x-numbering): the windows before, the window's served
            if j:
                read += np.bincount(which[used], minlength=len(keys))
            if self._in_part(epoch):
                part.base = {**self.part.base, **setup.bases}
                part.left, part.share = dict(self.part.left), dict(self.part.share)
            else:
                part.base = {keys[d]: (int(setup.counts[d]), self.salt()) for d in range(len(keys))}
            for d in range(len(keys)):
                part.left[keys[d]] = int(max(int(setup.counts[d]) - int(read[d]), 0))
                part.share[keys[d]] = float(setup.probs[d])
            if self._in_part(epoch):  # corpora this plan dropped: as they stood
                for k, p in self.part.positions.items():
                    if k not in part.positions:
                        part.positions[k] = p
                        if k in self.part.served:
                            part.served[k] = self.part.served[k]
        return part

    def _served_of(self, setup, d: int):
        if self.sampler.streams:
            return self.served_ahead.get(d)
        draw = setup.draws[d]
        if isinstance(draw, ExtendedDraw):
            return draw.served
        return self.part.served.get(self.keys[d]) if self._in_part(setup.epoch) else None

    def served_by_key(self, epoch: int) -> dict:
        """Stream sampler: per stream name, its positions served ahead of where it stood when ``epoch`` began."""
        if not self.served_ahead:
            return {}
        return self._served_by_key(self.epoch_start(epoch)[0])

    def _served_by_key(self, positions) -> dict:
        out = {}
        for d, s in self.served_ahead.items():
            s = s[s >= int(positions[d])]
            if len(s):
                out[self.keys[d]] = s
        return out

    def begin(self, part: Part) -> Part | None:
        """Plan this run from ``part`` on (another plan's :meth:`handoff`, or a state's): the rest of its epoch
        from its global batch, every stream from its position, skipping its served positions. A handoff's part
        (``samples`` -1) is sized here: this mixture's epoch size times the share not yet planned. Returns the
        part; None where it is a whole epoch from its start (nothing to remember but the streams' positions)."""
        keys = list(self.keys)
        index = {k: i for i, k in enumerate(keys)}
        self.forget_plans()
        self.part = None
        if self.sampler.streams:
            positions = np.array([int(part.positions.get(k, 0)) for k in keys], np.int64)
            self.served_ahead = {index[k]: np.asarray(s, np.int64) for k, s in part.served.items() if k in index}
            self._starts = {e: v for e, v in self._starts.items() if e < part.epoch}
            self._starts[part.epoch] = (positions, int(part.batches))
        if part.batch == 0 and part.done == 0.0:
            return None
        if part.samples >= 0:  # (sized when the edit was made: a state's)
            self.part = Part(**{**part.__dict__, "positions": dict(part.positions), "served": dict(part.served)})
            return self.part
        directions = self.sources.directions(part.epoch)
        if self.sampler.streams:
            ratios, total = self.mixture(directions, self.update_at(part.batches), part.epoch, batches=part.batches)
        else:
            ratios, total = self.mixture(directions, epoch=part.epoch)
        if self.sampler.sizes_epochs:
            samples = remainder(part.done, total)
        else:  # concat: what is left of every corpus's pass, and the whole of a corpus new to the epoch
            samples = 0
            for d, key in zip(directions, keys):
                if key in part.base:
                    count = part.base[key][0]
                    seen = available(int(part.positions.get(key, 0)), part.served.get(key), np.arange(1))[0]
                    ahead = part.served.get(key, np.zeros(0, np.int64))
                    samples += max(count - int(seen) - int(((ahead >= seen) & (ahead < count)).sum()), 0)
                else:
                    samples += d.size
        self.part = Part(part.epoch, part.batch, int(samples), part.done, dict(part.positions), dict(part.served),
                         dict(part.base), part.batches, dict(part.left), dict(part.share))
        return self.part

    def _part_setup(self, epoch: int):
        """Stratified and concat: the rest of an epoch after an edit, every corpus reading on from its position
        in the epoch's draw (then its extension)."""
        p, o = self.part, self.opts
        directions = self.sources.directions(epoch)
        ratios = self.ratios(directions, epoch=epoch)
        probs = self.sampler.probabilities(ratios)
        draws, bases = [], {}
        if self.sampler.sizes_epochs:
            counts = part_counts(probs, p, list(self.keys))
        else:
            counts = np.zeros(len(directions), np.int64)
        for i, (d, key) in enumerate(zip(directions, self.keys)):
            count, salt = p.base.get(key, (0, None))
            if key not in p.base and not self.sampler.sizes_epochs:  # (concat: a corpus new to the epoch, whole)
                count, salt = d.size, self.salt()
            bases[key] = (count, salt)
            draw = ExtendedDraw(d.size, count, base_draw(d.size, count, salt, o.seed, epoch, key),
                                extension_key(o.seed, epoch, key), p.positions.get(key, 0), p.served.get(key))
            if not self.sampler.sizes_epochs:
                seen = int(draw.positions(np.arange(1))[0])
                ahead = draw.served
                counts[i] = max(count - seen - int(((ahead >= seen) & (ahead < count)).sum()), 0)
            draws.append(draw if counts[i] else None)
        total = int(counts.sum())
        num_windows = 1 if not o.window or total <= o.window else -(-total // o.window)
        setup = EpochSetup(epoch, directions, probs, counts, draws, max(num_windows, 1))
        setup.bases = bases  # (each corpus's epoch draw, for the next edit's handoff)
        return setup


def part_counts(probs, part: Part, keys: list) -> np.ndarray:
    """Per corpus, the draws of a stratified part: what the plan before the edit still had for it (``left``),
    scaled by how its share changed (the edited probability over the old one, and the part's size over what was
    left), or, for a corpus it did not draw, its share of the part; rounded by largest remainders to
    ``part.samples`` in all. An edit that keeps every share keeps every count."""
    probs = np.asarray(probs, np.float64)
    left_total = sum(part.left.values())
    real = probs * part.samples
    for i, k in enumerate(keys):
        old = part.share.get(k, 0.0)
        if old > 0 and left_total > 0 and k in part.left:
            real[i] = part.left[k] * (probs[i] / old) * (part.samples / left_total)  # (ratios: exact when kept)
    total = int(round(real.sum()))
    out = np.floor(real).astype(np.int64)
    rest = total - int(out.sum())
    if rest > 0:
        order = np.lexsort((np.arange(len(real)), -(real - out)))
        out[order[:rest]] += 1
    return out
