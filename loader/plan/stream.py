"""The stream sampler's side of the planner: every stream is endless and keeps its position across epochs.

Pass c over a stream's n rows is a keyed permutation (``mixing.StreamDraw``). The mix is decided per planning
window, from the weights at the optimizer update of the window's first batch, so windows are planned in order:
each window's *mark* (sample offset in the epoch, every stream's position, global batches before it, the update
its weights come from) follows from planning the one before it. With a ``step`` schedule a window that would run
past a boundary is re-planned, cut where the boundary falls, so the next window starts on the new weights.

:class:`StreamPlanning` is a part of :class:`~babelfeed.plan.planner.EpochPlanner`; it uses the planner's ``setup``,
``window``, ``probabilities`` and ``_plan_window``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from babelfeed.plan.samples import EpochSetup
from babelfeed.plan.mixing import StreamDraw, stratified_counts, stream_rows
from babelfeed.plan.packing import ragged_arange
from babelfeed.plan.parts import after, available
from babelfeed.errors import ConfigError, OutOfRange, StateError
from babelfeed.stages import timed


@dataclass
class WeightChanges:
    """What the stream windows mix with besides the config: ``changes``, the task weights set during the run
    (``[(global batch, weights)]``, normalised, in order) and ``updates``, how optimizer updates were counted
    (``[(first global batch, its update, batches per update)]``). The run record's weights component
    (``babelfeed.run.weights``) takes this object's place once an iterator holds the planner."""

    changes: list
    updates: list


@dataclass(frozen=True)
class StreamMark:
    """Where the stream sampler stands at the start of a window: sample offset in the epoch, every stream's
    position (samples read since training began), global batches before it (since training began), and the
    optimizer update whose weights the window uses."""

    sample: int
    positions: np.ndarray
    batches: int
    update: float


class StreamPlanning:
    def _check_schedule(self) -> None:
        """Plan the epoch-1 probabilities and epoch size now, at every phase of a mixing schedule (at each
        boundary): what cannot be planned, or plans an empty epoch, fails at build, not hours into training."""
        schedule = self.opts.schedule
        if not self.sampler.sizes_epochs:
            return
        directions = self.sources.directions(1)
        phases = (0, *schedule.boundaries) if schedule is not None and schedule.boundaries else (0,)
        for i, update in enumerate(phases):
            where = f"mixing.schedule weight list {i} {list(schedule.weights[i])}: " if len(phases) > 1 else ""
            try:
                ratios, total = self.mixture(directions, update, 1)
            except ValueError as e:
                raise ConfigError(f"{where}{e}") from None
            self._refuse_empty(directions, ratios, 1, where)
            if not total > 0:
                raise ConfigError(f"{where}the epoch would hold no sample (mixing.virtual_size="
                                  f"{self.opts.virtual_size!r}, mixing.max_scale_up={self.opts.max_scale_up})")
        if self.sources.shards == "cycle":  # every later epoch reads another shard: each is checked now
            for epoch in range(2, self.sources.max_shards + 1):
                later = self.sources.directions(epoch)
                for i, update in enumerate(phases):
                    where = f"mixing.schedule weight list {i} {list(schedule.weights[i])}: " if len(phases) > 1 else ""
                    self._refuse_empty(later, self.ratios(later, update, epoch), epoch, where)

    @staticmethod
    def _refuse_empty(directions, ratios, epoch: int, where: str = "") -> None:
        """Directions the mixture samples in ``epoch`` that have no sentences there (e.g. an empty cycled shard)."""
        empty = [d.key for d, r in zip(directions, ratios) if r > 0 and not d.size]
        cycled = [d for d, r in zip(directions, ratios)  # (a shard of one that has sentences in others)
                  if r > 0 and not d.size and len(d.shard_sizes or ()) > 1 and sum(d.shard_sizes) > 0]
        if cycled:
            d = cycled[0]
            raise ConfigError(f"{where}epoch {epoch} reads shard {(epoch - 1) % len(d.shard_sizes)} of each direction "
                              f"(data.shards='cycle'), and that shard of {[c.key for c in cycled][:5]} has no "
                              f"sentences but is sampled: remove the empty shard (or fill it), or set data.shards='all'")
        if empty:
            raise ConfigError(f"{where}{empty[:5]} have no sentences in epoch {epoch} but are sampled: leave them out "
                              f"of data.directions or give them weight 0 (their files are empty in every shard read)")

    def _stream_setup(self, epoch: int, directions, sizes: np.ndarray):

        positions, batches = self.epoch_start(epoch)
        update = self.update_at(batches)
        ratios, total = self.mixture(directions, update, batches=batches)
        probs = self.sampler.probabilities(ratios)
        part = self.part
        total = part.samples if part is not None and part.epoch == epoch else total
        draws = [StreamDraw(d.size, (self.opts.seed, "stream", d.key)) for d in directions]
        setup = EpochSetup(epoch, directions, probs, np.zeros(len(directions), np.int64), draws, -1,
                           samples=total, expected=stratified_counts(probs, total))
        setup.stream[0] = StreamMark(0, positions, batches, update)
        self._setup = setup
        self._window_cache = None
        return setup

    # The optimizer update of a position (global batches since training began): batches / batches_per_update,
    # piecewise once the run was resumed with another world size or accumulation. ``update_segments`` holds
    # (first global batch, its update, batches per update) per segment; a segment begins at a window's first
    # batch, so every window is planned with the updates the run it belongs to counted.
    def update_at(self, batches: float) -> float:
        segs = self.update_segments
        k = len(segs) - 1
        while k > 0 and segs[k][0] > batches:
            k -= 1
        b0, u0, per = segs[k]
        return u0 + (batches - b0) / per if k else batches / per

    def batches_at(self, update: float) -> float:
        """The inverse of :meth:`update_at`: global batches since training began at an update."""
        segs = self.update_segments
        k = len(segs) - 1
        while k > 0 and segs[k][1] > update:
            k -= 1
        b0, u0, per = segs[k]
        return b0 + (update - u0) * per if k else update * per

    def epoch_start(self, epoch: int) -> tuple[np.ndarray, int]:
        """Stream sampler: (every stream's position, global batches since training began) at the start of
        ``epoch``. Known from the previous epoch's plan or a resumed state; otherwise earlier epochs are planned
        (integers only) to find it."""
        if epoch not in self._starts:
            known = max(e for e in self._starts if e < epoch)
            for e in range(known, epoch):
                self.num_batches(e)
        return self._starts[epoch]

    def since_start(self, epoch: int, consumed: int) -> int:
        """Stream sampler: global batches since training began at global batch ``consumed`` of ``epoch``."""
        return int(self.epoch_start(epoch)[1]) + int(consumed) - self.first_batch(epoch)

    def set_epoch_start(self, epoch: int, positions, batches: int) -> None:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.shape != (len(self.keys),) or (positions < 0).any() or batches < 0:
            raise StateError(f"a stream state needs {len(self.keys)} non-negative positions, got {positions.tolist()}")
        self._starts[epoch] = (positions, int(batches))
        if self._setup is not None and self._setup.epoch == epoch:
            self._setup = None

    @timed("plan")
    def _stream_window(self, setup, epoch: int, w: int):
        """Window w of a stream epoch: counts from the weights at its first batch's update. With a step
        schedule, a window that would run past a boundary is cut where the boundary falls, and the next window
        starts on the new weights."""
        o = self.opts
        self._plan_marks(setup, w)
        if w not in setup.stream or setup.stream[w].sample >= setup.samples:
            raise OutOfRange(f"epoch {epoch} has fewer than {w + 1} windows")
        mark = setup.stream[w]
        size = min(o.window or setup.samples, setup.samples - mark.sample)
        win, counts = self._stream_plan(setup, epoch, w, mark, size)
        next_update = self.update_at(mark.batches + len(win))
        sched = o.schedule
        if sched is not None and sched.mode == "step" and len(win):
            crossed = [b for b in sched.boundaries if mark.update < b < next_update]
            if crossed and size > 1:
                at = self.batches_at(crossed[0]) - mark.batches  # batches until the boundary
                size = max(1, size * at // len(win))
                win, counts = self._stream_plan(setup, epoch, w, mark, size)
                next_update = max(self.update_at(mark.batches + len(win)), crossed[0])
        if w + 1 not in setup.stream:
            setup.counts += counts
            setup.window_counts[w] = counts
            nxt = StreamMark(mark.sample + size, self._read_on(mark.positions, counts), mark.batches + len(win),
                             next_update)
            setup.stream[w + 1] = nxt
            if nxt.sample >= setup.samples:
                setup.num_windows = w + 1
                self._starts[epoch + 1] = (nxt.positions, nxt.batches)
        return win

    def _stream_plan(self, setup, epoch, w, mark: StreamMark, size: int):
        probs = self.probabilities(setup.directions, mark.update, batches=mark.batches)
        counts = stratified_counts(probs, size)
        live = np.flatnonzero(counts)
        dirs = np.repeat(live, counts[live]).astype(np.int32)
        rows = stream_rows(setup.draws, dirs, self._stream_positions(mark.positions, counts, live))
        at = np.concatenate([[0], np.cumsum(counts[live])])
        spans = [(d, int(a), int(b)) for d, a, b in zip(live.tolist(), at[:-1].tolist(), at[1:].tolist())]
        return self._plan_window(setup, epoch, w, dirs, rows, spans), counts

    def _stream_positions(self, positions, counts, live) -> np.ndarray:
        """The positions each live stream reads ``counts`` rows at from ``positions`` on: consecutive, skipping
        what a mixture edit left served ahead (``plan.parts``)."""
        pos = ragged_arange(positions[live], counts[live])
        if self.served_ahead:
            at = np.concatenate([[0], np.cumsum(counts[live])])
            for i, d in enumerate(live.tolist()):
                if d in self.served_ahead:
                    pos[at[i]:at[i + 1]] = available(int(positions[d]), self.served_ahead[d],
                                                     np.arange(int(counts[d]), dtype=np.int64))
        return pos

    def _read_on(self, positions, counts) -> np.ndarray:
        """Every stream's position once it has read ``counts`` more rows (past the served positions ahead)."""
        out = positions + counts
        for d, served in self.served_ahead.items():
            if counts[d]:
                last = available(int(positions[d]), served, np.array([int(counts[d]) - 1]))[0]
                out[d] = after(int(positions[d]), served, int(last))[0]
        return out

    def stream_mark(self, epoch: int, w: int) -> StreamMark:
        """Stream sampler: the mark at the start of window w (plans earlier windows if needed)."""
        setup = self.setup(epoch)
        self._plan_marks(setup, w)
        return setup.stream[w]

    def _plan_marks(self, setup, w: int) -> None:
        """Plan the windows before w until its mark exists (or the epoch's last window is planned): each
        window's mark comes from planning the one before it."""
        while w not in setup.stream and setup.num_windows < 0:
            self.window(setup.epoch, max(setup.stream))
