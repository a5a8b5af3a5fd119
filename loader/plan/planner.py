"""Plan an epoch on integers: which samples, in which window, in which batch, in which order.

    epoch e ──▶ directions (shard (e-1) % k of each) ──▶ counts c_i (temperature, virtual size)
            ──▶ windows: window w takes a proportional slice of every direction's pseudorandom sequence
            ──▶ per window: lengths and token addresses, filter too-long, order by (max(src,tgt), src),
                cut into batches (cutting.py), shuffle batches in blocks of similar cost
            ──▶ global batch g of the epoch is served by rank g % world_size (iterator.py)
            ──▶ gather + collate (collate.py, gather.py)

Every random choice is a pure function of (seed, epoch, window). A window holds, per sample in batch order,
its stream (direction), component, row and lengths; per-corpus planning work is paid once per window (thousands
of batches), never per batch. Where the tokens lie is looked up for the batches a rank gathers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import numpy as np

from babelfeed.plan import cutting
from babelfeed.plan.batching import length_order, random_key
from babelfeed.plan.mixing import StratifiedDraw, capped_probabilities, stratified_rows, stratified_span_rows
from babelfeed.plan.cutters import choose as choose_cutter
from babelfeed.plan.samplers import choose as choose_sampler
from babelfeed.plan.packing import ragged_arange
from babelfeed.checks import is_int
from babelfeed.plan.options import LATER_OPTIONS, PlanOptions
from babelfeed.plan.parts import ExtendedDraw, PartPlanning
from babelfeed.plan.stream import StreamPlanning, WeightChanges
from babelfeed.plan.totals import window_totals
from babelfeed.sources.rows import groups
from babelfeed._native import plan_kernel
from babelfeed.plan.samples import EpochSetup, Samples, Window
from babelfeed.sources.sources import Direction, SourceSet, data_digest, locate_many
from babelfeed.errors import ConfigError, DataError, OutOfRange, UsageError, UsageTypeError
from babelfeed.stages import timed


class EpochPlanner(StreamPlanning, PartPlanning):
    """The integer plan of every epoch: which samples, in which window, in which batch, in which order."""

    def __init__(self, sources: SourceSet, opts: PlanOptions):
        if not isinstance(opts, PlanOptions):
            raise UsageTypeError(f"opts must be a babelfeed.plan.options.PlanOptions, got {type(opts).__name__}")
        if not hasattr(sources, "directions"):
            raise UsageTypeError(f"sources must be a babelfeed.sources.sources.SourceSet, got {type(sources).__name__}")
        opts = opts.checked()
        self.sources, self.opts = sources, opts
        self.sampler = choose_sampler(opts.sampler)  # how an epoch's samples are drawn (babelfeed.plan.samplers)
        self.cutter = choose_cutter(opts)  # how a window's samples are cut into batches (babelfeed.plan.cutters)
        self._setup: EpochSetup | None = None
        self._window_cache: list | None = None  # [((epoch, window), Window)], the latest first
        self._filtered: dict[int, dict[int, np.ndarray]] = {}  # epoch -> window -> too-long per direction
        self._masked: dict[int, dict[int, int]] = {}  # epoch -> window -> rows added to fill static shapes
        self._totals: dict[int, dict[int, np.ndarray]] = {}  # epoch -> window -> ledger.window_totals
        self._ledger_hint: tuple | None = None  # consumed_totals' last position and its totals
        # set_weights: (global batch since training began, task weights) in order; a stream window whose first
        # batch is at or after a change's batch mixes with its weights; and how updates were counted
        self.weights = WeightChanges([], [(0, 0.0, opts.batches_per_update)])
        self._starts: dict[int, tuple[np.ndarray, int]] = {1: (np.zeros(len(sources.keys), np.int64), 0)}
        self.part = None  # the run goes on from another plan inside an epoch (plan.parts: a mixture edit)
        self.served_ahead = {}  # stream sampler: per stream, positions served ahead of it (plan.parts)
        if opts.schedule is not None and len(opts.schedule.weights[0]) != len(sources.tasks):
            raise ConfigError(f"the mixing schedule has {len(opts.schedule.weights[0])} weights per list but there "
                              f"are {len(sources.tasks)} tasks {sources.tasks}")
        if self.sampler.streams and sources.shards == "cycle" and sources.max_shards > 1:
            raise ConfigError("mixing.sampler='stream' reads every shard as one stream per corpus: set "
                              "data.shards='all' (shard cycling is a per-epoch scheme)")
        if opts.method == "weights" and opts.schedule is None:
            given = dict(opts.weights)
            missing = [k for k in sources.keys if k not in given]
            extra = [k for k in given if k not in sources.keys]
            if missing or extra:
                raise ConfigError(f"mixing.weights must name exactly the directions used; missing {missing}, "
                                  f"unknown {extra}")
        self._check_schedule()

    @property
    def keys(self) -> list[str]:
        return self.sources.keys

    @property
    def weight_changes(self) -> list:
        return self.weights.changes

    @weight_changes.setter
    def weight_changes(self, value) -> None:
        self.weights.changes = list(value)

    @property
    def update_segments(self) -> list:
        return self.weights.updates

    @update_segments.setter
    def update_segments(self, value) -> None:
        self.weights.updates = list(value)

    def probabilities(self, directions: list[Direction], update: float = 0.0, epoch: int = 0,
                      batches: int | None = None) -> np.ndarray:
        """Per-direction (stream) sampling probabilities at an optimizer update (of ``epoch``, if known);
        ``batches``: the global batches since training began there, for the weights set by ``set_weights``."""
        r = self.ratios(directions, update, epoch, batches)
        return self.sampler.probabilities(r)

    def ratios(self, directions: list[Direction], update: float = 0.0, epoch: int = 0,
               batches: int | None = None) -> np.ndarray:
        """The probabilities, or for the fairseq sampler fairseq's unnormalised ratios (``Sampler.ratios``);
        capped where ``max_upsample`` caps them (:meth:`mixture`)."""
        return self.mixture(directions, update, epoch, batches)[0]

    def mixture(self, directions: list[Direction], update: float = 0.0, epoch: int = 0,
                batches: int | None = None) -> tuple[np.ndarray, int]:
        """(ratios, samples in the epoch) of ``directions`` at an optimizer update of ``epoch``. The epoch size
        is ``mixing.virtual_size`` of the sampler's ratios; with ``max_upsample`` (``mixing.method='unimax'``
        requires it) no direction is expected more than that many times its size (the epoch's shard) in the
        epoch: each over it is held at it and the rest shared among the others (UniMax, for the uniform method),
        and the epoch holds no more than the caps allow."""
        o = self.opts
        sizes = self.sampler.probability_sizes(o, directions, epoch, self.sources.shards == "cycle")
        weights = o.schedule.weights_at(update) if o.schedule is not None else None
        if batches is not None:
            for at, w in self.weight_changes:  # the last change at or before this point wins
                if at <= batches:
                    weights = w
        ratios = self.sampler.ratios(o, sizes, [d.key for d in directions], self.sources.task_of, weights)
        if not self.sampler.sizes_epochs:
            return ratios, 0
        read = np.array([d.size for d in directions], dtype=np.int64)
        total = self.sampler.epoch_total(o, read, ratios)
        if not o.max_upsample:
            return ratios, total
        probs = self.sampler.probabilities(ratios)
        total = min(total, int(read[probs > 0].sum() * o.max_upsample))
        return (capped_probabilities(probs, read, total, o.max_upsample) if total > 0 else probs), total

    def set_weights(self, at: int, weights) -> None:
        """Task weights (one per task, in ``sources.tasks`` order) for the stream windows whose first batch is at
        global batch ``at`` (since training began) or later; the plans of those already made are dropped."""
        if not self.sampler.streams:
            raise UsageError("set_weights changes the mixture window by window, which mixing.sampler='stream' does "
                             "(the other samplers fix an epoch's counts when it begins): set mixing.sampler='stream' "
                             "and data.shards='all'")
        w = np.asarray(weights, np.float64)
        if w.shape != (len(self.sources.tasks),) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
            raise UsageError(f"set_weights needs a weight >= 0 for each of the {len(self.sources.tasks)} tasks "
                             f"{self.sources.tasks}, not all 0; got {w.tolist()}")
        at = int(at)
        if self.weight_changes and at < self.weight_changes[-1][0]:
            raise UsageError(f"weight changes come in training order: global batch {at} is before the last change's "
                             f"{self.weight_changes[-1][0]}")
        self.weight_changes.append((at, w / w.sum()))
        self._drop_plans_from(at)

    @property
    def changing_schedule(self) -> bool:
        """A mixing schedule whose weights change with the update count (so how updates are counted matters)."""
        return self.opts.schedule is not None and bool(self.opts.schedule.boundaries)

    def count_updates_from_here(self, batches: int, per: int) -> int:
        """From the first stream window starting at global batch ``batches`` or later, an update is ``per``
        global batches (a run resumed on another world size or accumulation). Returns where that is."""
        if per == self.update_segments[-1][2]:
            return batches
        epoch = next(e for e in sorted(self._starts, reverse=True) if self._starts[e][1] <= batches)
        setup = self.setup(epoch)
        w = 0
        while True:  # the first window mark at or after the position (planning the windows before it)
            self._plan_marks(setup, w)
            if w not in setup.stream:  # past the epoch's last window: the next epoch's start
                self.num_batches(epoch)
                epoch += 1
                setup, w = self.setup(epoch), 0
                continue
            if setup.stream[w].batches >= batches:
                break
            w += 1
        at = setup.stream[w].batches
        # a count set by an earlier resume that has not taken effect yet (the run was resumed again before that
        # window mark) gives way to this one; none is needed where the count in force is already this one
        while self.update_segments and self.update_segments[-1][0] >= at:
            self.update_segments.pop()
        if not self.update_segments:  # (resumed before the run's first batch: the run counts this way throughout)
            self.update_segments = [(0, 0.0, int(per))]
        elif per != self.update_segments[-1][2]:
            self.update_segments.append((at, self.update_at(at), int(per)))
        self._drop_plans_from(at)
        return at

    def forget_plans(self) -> None:
        """Drop every plan and what was built on them (they are made again, identical, when asked for)."""
        self._setup, self._window_cache, self._ledger_hint = None, None, None
        self._filtered, self._masked, self._totals = {}, {}, {}
        first = min(self._starts)  # (an edited run's first known start: the run's, or its part's)
        self._starts = {first: self._starts[first]}

    def _drop_plans_from(self, at: int) -> None:
        """Forget what was planned with weights that a change at global batch ``at`` replaces: the stream windows
        starting at or after it (and everything after them), later epochs' starts, and the caches built on them."""
        self._window_cache = None
        self._ledger_hint = None
        setup = self._setup
        if setup is not None and setup.stream:
            first = setup.stream[0]
            if first.batches >= at:  # the epoch itself begins with the new weights: plan it anew
                epoch, self._setup = setup.epoch, None
                drop_from = (epoch, 0)
            else:
                # the first window starting at or after the change (the epoch's end mark is no window: the change
                # then begins with the next epoch, whose start positions stand)
                w = min((k for k, m in setup.stream.items() if m.batches >= at and m.sample < setup.samples),
                        default=None)
                drop_from = (setup.epoch, w) if w is not None else (setup.epoch + 1, 0)
                if w is not None:
                    for k in [k for k in setup.stream if k > w]:
                        del setup.stream[k]
                    for k in [k for k in setup.window_counts if k >= w]:
                        setup.counts -= setup.window_counts.pop(k)
                    for k in [k for k in setup.window_batches if k >= w]:
                        del setup.window_batches[k]
                    setup.num_windows = -1
        elif self._setup is None:
            # nothing of the epoch is planned: keep every epoch start known at or before the change (a start set
            # from a resumed state, or an edited run's, cannot be planned again from epoch 1)
            drop_from = (max(e for e, (_, b) in self._starts.items() if b <= at), 0)
        else:
            drop_from = (self._setup.epoch, 0)
        epoch, w = drop_from
        for cache in (self._filtered, self._masked, self._totals):
            for e in [e for e in cache if e > epoch]:
                del cache[e]
            for k in [k for k in cache.get(epoch, {}) if k >= w]:
                del cache[epoch][k]
        for e in [e for e in self._starts if e > epoch]:
            del self._starts[e]

    def setup(self, epoch: int) -> EpochSetup:
        if not is_int(epoch) or epoch < 1:
            raise UsageError(f"epoch must be an integer >= 1 (epochs count from 1), got {epoch!r}")
        if self._setup is not None and self._setup.epoch == epoch:
            return self._setup
        o = self.opts
        directions = self.sources.directions(epoch)
        sizes = np.array([d.size for d in directions], dtype=np.int64)
        if self.sampler.streams:
            return self._stream_setup(epoch, directions, sizes)
        if self.part is not None and self.part.epoch == epoch:
            self._setup = self._part_setup(epoch)
            self._window_cache = None
            return self._setup
        ratios, total = self.mixture(directions, epoch=epoch)
        probs = self.sampler.probabilities(ratios)
        if self.sampler.sizes_epochs:
            self._refuse_empty(directions, ratios, epoch)  # epoch 1 was checked at build, later epochs here
        counts, draws = self.sampler.draw(o, epoch, directions, sizes, ratios, total)
        total = int(counts.sum())
        num_windows = 1 if not o.window or total <= o.window or o.compat == "fairseq" else -(-total // o.window)
        self._setup = EpochSetup(epoch, directions, probs, counts, draws, max(num_windows, 1))
        self._window_cache = None
        return self._setup

    # ------------------------------------------------------------------------------------------- windows
    def _window_slice(self, setup: EpochSetup, w: int) -> tuple[np.ndarray | None, np.ndarray, list]:
        """The window's samples as (direction, row) arrays, direction by direction, and each direction's span
        (the directions None where every one is drawn: ``_directions`` spells them out from the spans).

        Window w takes positions ``[c w_lo / total, c w_hi / total)`` of every direction's sequence (c its count);
        the rows at those positions come from every direction's draw in one vectorised pass."""
        lo, hi = self._slice_bounds(setup, w)
        take = np.maximum(hi - lo, 0)
        live = np.flatnonzero(take)
        at = np.concatenate([[0], np.cumsum(take[live])])
        spans = [(d, int(a), int(b)) for d, a, b in zip(live.tolist(), at[:-1].tolist(), at[1:].tolist())]
        kinds = np.array([0 if d is None else 1 if isinstance(d, StratifiedDraw) else 3 if isinstance(d, ExtendedDraw)
                          else 2 for d in setup.draws])
        if (kinds[live] == 1).all():  # every direction drawn: its run of positions, no per-sample arrays
            return None, stratified_span_rows(setup.draws, np.stack([live, lo[live], take[live]], axis=1)), spans
        dirs = np.repeat(live, take[live]).astype(np.int32)
        pos = ragged_arange(lo[live], take[live])
        rows = pos.copy()  # directions without a draw are read in order
        strat = kinds[dirs] == 1
        if strat.all():
            rows = stratified_rows(setup.draws, dirs, pos, used=live)
        elif strat.any():
            rows[strat] = stratified_rows(setup.draws, dirs[strat], pos[strat], used=live[kinds[live] == 1])
        for d, a, b in spans:
            if kinds[d] == 2:  # fairseq's draw: an index array per direction
                rows[a:b] = np.asarray(setup.draws[d][lo[d]:hi[d]], dtype=np.int64)
            elif kinds[d] == 3:  # the rest of an epoch after an edit (plan.parts)
                rows[a:b] = setup.draws[d].rows(np.arange(lo[d], hi[d], dtype=np.int64))
        return dirs, rows, spans

    def window(self, epoch: int, w: int) -> Window:
        for key, win in self._window_cache or ():
            if key == (epoch, w):
                return win
        setup = self.setup(epoch)
        if self.sampler.streams:
            return self._stream_window(setup, epoch, w)
        if not 0 <= w < setup.num_windows:
            raise OutOfRange(f"epoch {epoch} has {setup.num_windows} windows, not {w + 1}")
        dirs, rows, spans = self._window_slice(setup, w)
        return self._plan_window(setup, epoch, w, dirs, rows, spans)

    def _describe(self, setup: EpochSetup, dirs, rows, spans) -> Samples:
        """Per sample (in window order): component, row there, and lengths. Components are looked up for every
        direction at once; each component's lengths are read once per window (or from the flat row table)."""
        s = Samples.empty(len(rows))
        pairs = s.m[:, :2].view(np.int32)
        pairs[:, 0] = dirs = self._directions(dirs, spans)
        comp, local = locate_many(setup.directions, dirs, rows)
        pairs[:, 1] = comp
        s.m[:, 2] = local
        table = self.sources.row_table()
        if table is not None:  # every component's rows in flat arrays: a few gathers for the whole window
            table.lengths(comp, local, pairs)
            return s
        comps = self.sources.components
        if all(len(setup.directions[d].components) == 1 for d, _, _ in spans):  # a span is one component
            for d, a, b in spans:
                comps[setup.directions[d].component_ids[0]].lengths(local[a:b], pairs[a:b])
            return s
        for group in groups(comp):
            sub = s.m[group]
            comps[int(comp[group[0]])].lengths(local[group], sub[:, :2].view(np.int32))
            s.m[group] = sub
        return s

    @timed("plan")
    def _plan_window(self, setup: EpochSetup, epoch: int, w: int, dirs, rows, spans) -> Window:
        """A window's samples -> lengths and addresses, filter, order, batches, served order."""
        o = self.opts
        if not self.cutter.orders:  # fairseq's own filter, order and batches
            return self.cutter.window(self, setup, epoch, w, dirs, rows, spans)
        first = self.first_batch(epoch)  # (a part after an edit: its own shuffles)
        rng = np.random.default_rng([o.seed, epoch, w, 7] + ([first] if first else []))
        s, filtered, totals = self._ordered(setup, dirs, rows, spans, rng)
        src_len, tgt_len = (s.src_len.astype(np.int64), s.tgt_len.astype(np.int64)) if self.cutter.wide \
            else (s.src_len, s.tgt_len)  # dynamic batches read the int32 columns as they are
        cut = self.cutter.cut(self, s, src_len, tgt_len, rng, self._may_repeat(setup))
        if cut.unfit is not None:
            filtered = filtered + np.bincount(s.direction[cut.unfit], minlength=len(setup.directions))
        served = cutting.block_shuffle(len(cut.ends), o.balance_block, rng) if o.shuffle else np.arange(len(cut.ends))
        return self._finish(setup, epoch, w, s, cut.sub, cut.ends, served, filtered, cut.shape, cut.masked, cut.packed,
                            totals if cut.sub is None else None)  # (a cut that selects: its own totals)

    @staticmethod
    def _may_repeat(setup: EpochSetup) -> np.ndarray:
        """Per direction: whether the epoch draws it more often than it has rows (only those can put copies of
        one row in one window: ``babelfeed.plan.copies``)."""
        draws = setup.expected if setup.expected is not None else setup.counts
        return np.asarray(draws, np.int64) > np.array([d.size for d in setup.directions], np.int64)

    def _ordered(self, setup: EpochSetup, dirs, rows, spans, rng) -> tuple[Samples, np.ndarray, np.ndarray | None]:
        """The window's samples without the too-long ones, in length order, the too-long count per direction, and
        (from the kernel) their ``window_totals``, else None.
        Compiled, where each span is one component: the lengths into a [n, 2] table, then the rows written
        straight in order (``plan_kernel.sorted_rows``) instead of built, sorted and moved at random."""
        o = self.opts
        table, lens = self._window_lengths(setup, rows, spans) if o.shuffle else (None, None)
        s = self._describe(setup, dirs, rows, spans) if lens is None else None
        src_len, tgt_len = (s.src_len, s.tgt_len) if lens is None else (lens[:, 0], lens[:, 1])  # int32, in place
        filtered = np.zeros(len(setup.directions), np.int64)
        keep = None  # every sample
        limit = min(o.max_source_positions, o.max_target_positions)
        too_long = None if lens is not None and (not len(lens) or int(lens.max()) <= limit) else \
            (src_len > o.max_source_positions) | (tgt_len > o.max_target_positions)  # above: one flat max says none
        if too_long is not None and too_long.any():
            dirs = self._directions(dirs, spans)
            filtered = np.bincount(dirs[too_long], minlength=len(setup.directions)).astype(np.int64)
            if o.on_too_long == "raise":
                i = int(np.flatnonzero(too_long)[0])
                d = setup.directions[int(dirs[i])]
                comp, local = locate_many(setup.directions, dirs[i:i + 1], np.asarray(rows[i:i + 1]))
                c = self.sources.components[int(comp[0])]  # the record in its own file (shards joined: not the row)
                raise DataError(
                    f"{d.key} shard {c.shard} record {int(local[0])} ({c.src.index_file}): {int(src_len[i])} source / "
                    f"{int(tgt_len[i])} target tokens, over max_source_positions={o.max_source_positions} / "
                    f"max_target_positions={o.max_target_positions} ({o.too_long_key}='raise'; 'skip' drops and "
                    f"counts such samples)")
            keep = np.flatnonzero(~too_long)
            src_len, tgt_len = src_len[keep], tgt_len[keep]
        tgt = tgt_len if self.sources.with_target else None
        if not o.shuffle:  # validation: by (cost, src), ties in sample order; no randomness
            order = np.lexsort((src_len, np.maximum(src_len, tgt_len)))
        else:
            rkey = random_key(rng, len(src_len))
            if lens is not None:
                ends, pairs = np.array([b for _, _, b in spans], np.int64), self._span_pairs(setup, spans)
                sums = np.empty((len(spans), 3), np.int64)
                m = plan_kernel.sorted_rows(lens, tgt is not None, keep, rkey, rows, ends, pairs, table, sums)
                if m is not None:
                    totals = np.zeros((len(setup.directions), 3), np.int64)
                    np.add.at(totals, [d for d, _, _ in spans], sums)
                    return Samples(m), filtered, np.ascontiguousarray(totals.T)
                s = Samples.empty(len(rows))  # lengths or keys the kernel does not take: built, ordered, moved
                s.m[:, 2] = rows
                s.m[:, :2].view(np.int32)[:, 2:] = lens
                s.m[:, 0] = np.repeat(pairs, np.diff(ends, prepend=0))
            order = length_order(src_len, tgt, rng, rkey)
        return s[order if keep is None else keep[order]], filtered, None  # one reorder of the per-sample rows

    def _window_lengths(self, setup: EpochSetup, rows, spans) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The window's rows to come and its (src, tgt) lengths, int32 [n, 2], in their top third
        (``plan_kernel.rows_with_lengths``), where the kernel is built, no row table is kept and each span is one
        component; else (None, None)."""
        dl = setup.directions
        if plan_kernel.KERNEL is None or not spans or self.sources.row_table() is not None or \
                any(len(dl[d].components) != 1 for d, _, _ in spans):
            return None, None
        table, lens = plan_kernel.rows_with_lengths(len(rows))
        for d, a, b in spans:
            comp = dl[d].components[0]
            if comp.tgt is None:
                lens[a:b, 1] = 0
            comp.lengths(rows[a:b], lens[a:b])
        return table, lens

    @staticmethod
    def _directions(dirs, spans) -> np.ndarray:
        """Each sample's direction (int32), spelled out from the spans where the slice left it out."""
        if dirs is not None:
            return dirs
        return np.repeat([d for d, _, _ in spans], [b - a for _, a, b in spans]).astype(np.int32)

    @staticmethod
    def _span_pairs(setup: EpochSetup, spans) -> np.ndarray:
        """Per span its (direction, component) int32 pair, viewed as the int64 that the planner's rows hold."""
        pairs = np.array([[d, setup.directions[d].component_ids[0]] for d, _, _ in spans], np.int32)
        return pairs.view(np.int64).reshape(-1)

    def _finish(self, setup, epoch, w, s, select, ends, served, filtered, shape=None, masked=None,
                packed=None, totals=None) -> Window:
        """Reorder the per-sample rows once into batch order (``select=None``: they are) and record the window
        (``totals``: its ``window_totals`` where already summed)."""
        win = Window(epoch, w, s if select is None else s[select], ends=ends, order=served, shape=shape,
                     masked=masked, packed=packed)
        self._filtered.setdefault(win.epoch, {})[win.index] = filtered
        if win.index not in self._totals.get(win.epoch, {}):
            self._totals.setdefault(win.epoch, {})[win.index] = totals if totals is not None else window_totals(
                win.samples.direction, win.samples.src_len, win.samples.tgt_len, len(setup.directions))
        if win.masked is not None:
            self._masked.setdefault(win.epoch, {})[win.index] = int(win.masked.sum())  # rows (packing: of pairs)
        setup.window_batches[win.index] = len(win)
        key = (win.epoch, win.index)  # the last two windows kept: a prefetcher reads the next one's rows ahead
        self._window_cache = [(key, win)] + [c for c in (self._window_cache or ()) if c[0] != key][:1]
        return win

    def rows_per_packed_batch(self) -> int:
        o = self.opts
        return cutting.packed_rows_per_batch(o.pack_shape, o.max_tokens, o.max_sentences, o.multiple)

    # ------------------------------------------------------------------------------------------- lookup
    def window_start(self, epoch: int, w: int) -> int:
        """Global index of window w's first batch (plans earlier windows' integers if needed)."""
        setup = self.setup(epoch)
        start = self.first_batch(epoch)
        for k in range(w):
            if k not in setup.window_batches:
                self.window(epoch, k)
            start += setup.window_batches[k]
        return start

    def locate(self, epoch: int, g: int, hint: tuple[int, int] = (0, 0)) -> tuple[int, int] | None:
        """(window, position in window) of global batch g, or None when the epoch has fewer batches."""
        setup = self.setup(epoch)
        first = self.first_batch(epoch)
        if g < first:
            raise UsageError(f"global batch {g} of epoch {epoch} was planned before this plan's part of the run "
                             f"began (at global batch {first}, a mixture edit)")
        w, start = hint
        if start > g or start < first:
            w, start = 0, first
        while self._exists(setup, w):
            n = setup.window_batches.get(w)
            if n is None:
                self.window(epoch, w)
                n = setup.window_batches[w]
            if g < start + n:
                return w, g - start
            start += n
            w += 1
        return None

    def window_end(self, epoch: int, g: int) -> int:
        """Where the planning window holding global batch ``g`` of ``epoch`` ends (``g`` itself at a window's
        first batch or past the epoch's end): where an edit of babelfeed 0.1 began, which finished the saved
        run's window in progress first."""
        where = self.locate(epoch, g)
        if where is None or where[1] == 0:
            return g
        return self.window_start(epoch, where[0]) + len(self.window(epoch, where[0]))

    def num_batches(self, epoch: int) -> int:
        """Batches in the epoch (plans every window's integers the first time)."""
        setup = self.setup(epoch)
        w = 0
        while self._exists(setup, w):
            if w not in setup.window_batches:
                self.window(epoch, w)
            w += 1
        return self.first_batch(epoch) + sum(setup.window_batches[k] for k in range(w))

    def _exists(self, setup: EpochSetup, w: int) -> bool:
        """Whether the epoch has a window w (stream sampler: plans the windows before it to find out)."""
        if setup.num_windows >= 0:
            return w < setup.num_windows
        self._plan_marks(setup, w)
        return w in setup.stream and setup.stream[w].sample < setup.samples

    def window_totals(self, epoch: int, w: int) -> np.ndarray:
        """``int64[3, streams]``: samples, source and target tokens per stream of window w (planned if needed)."""
        totals = self._totals.get(epoch, {}).get(w)
        if totals is None:
            self.window(epoch, w)
            totals = self._totals[epoch][w]
        return totals

    def consumed_totals(self, epoch: int, consumed: int) -> np.ndarray:
        """The ledger's totals of global batches ``[0, consumed)`` of ``epoch`` (every batch of it when
        ``consumed`` is past its end): the windows before the position whole, and its window's served batches.
        Incremental: a position at or after the one asked for last adds only the batches in between."""

        def part(w: int, start: int, j0: int, j1: int) -> np.ndarray:
            win = self.window(epoch, w)
            rows = win.batch_rows(np.arange(j0, j1))
            s = win.samples
            return window_totals(s.direction[rows], s.src_len[rows], s.tgt_len[rows], len(self.keys))

        total, self._ledger_hint = self.sum_batches(epoch, consumed, self._ledger_hint,
                                                    lambda w, start, n: self.window_totals(epoch, w), part)
        return total

    def sum_batches(self, epoch: int, consumed: int, hint, whole, part) -> tuple[np.ndarray, tuple]:
        """An int64[3, streams] sum over global batches ``[0, consumed)`` of ``epoch``: ``whole(w, start, n)`` for
        each window before the position (its first global batch ``start``, its ``n`` batches), ``part(w, start,
        j0, j1)`` for the served batches ``[j0, j1)`` of the position's window. Incremental: ``hint`` (the hint the
        last call returned, or None) lets a position at or after that call's add only the batches in between.
        Returns the sum and the hint for the next call."""
        zeros = np.zeros((3, len(self.keys)), np.int64)
        if hint is None or hint[0] != epoch or consumed < hint[2] + hint[4]:
            hint = (epoch, 0, self.first_batch(epoch), zeros, 0, zeros)
        _, w, start, base, j, acc = hint
        setup = self.setup(epoch)
        while consumed > start and self._exists(setup, w):
            n = setup.window_batches.get(w)
            if n is None:
                self.window(epoch, w)
                n = setup.window_batches[w]
            if consumed >= start + n:  # the whole window
                base, start, w, j, acc = base + whole(w, start, n), start + n, w + 1, 0, zeros
                continue
            if consumed - start > j:  # its served batches since the last call
                acc = acc + part(w, start, j, consumed - start)
                j = consumed - start
            break
        return base + acc, (epoch, w, start, base, j, acc)

    def masked_rows(self, epoch: int) -> int:
        """Rows added to fill static-shape batches in ``epoch``, over the windows planned so far."""
        return int(sum(self._masked.get(epoch, {}).values()))

    def filtered(self, epoch: int) -> np.ndarray:
        """Too-long samples per direction in ``epoch``, over the windows planned so far."""
        out = np.zeros(len(self.sources.keys), dtype=np.int64)
        for counts in self._filtered.get(epoch, {}).values():
            out += counts
        return out

    def identity(self) -> dict:
        """What the fingerprint stands for, small enough for a state to keep so that a mismatch can say what
        changed: the plan options, the split and shards, and per stream a digest of its shards' data."""
        if getattr(self, "_identity", None) is None:
            streams: dict = {}
            for c in self.sources.components:
                streams.setdefault(c.key, []).append((c.shard, len(c), c.src_prefix.tolist(), c.tgt_prefix.tolist(),
                                                      data_digest(c.src), data_digest(c.tgt)))
            opts = self._stated_opts(with_updates=False)
            self._identity = {
                "opts": json.loads(json.dumps(opts, sort_keys=True, default=str)),
                "split": self.sources.split, "shards": self.sources.shards,
                "streams": {k: hashlib.sha256(json.dumps(v, default=str).encode()).hexdigest()[:12]
                            for k, v in streams.items()}}
        return self._identity

    LATER_OPTIONS = LATER_OPTIONS  # (plan.options: left out of the fingerprint and identity at their default)

    def _stated_opts(self, with_updates: bool) -> dict:
        """The plan options as a fingerprint and an identity hold them (``with_updates``: the batches per update
        too)."""
        opts = asdict(self.opts)
        if not with_updates:
            opts.pop("batches_per_update")
        for name in self.LATER_OPTIONS:
            if not opts[name]:
                opts.pop(name)
        if opts.get("max_upsample"):  # a cap's counts are at most floor(cap x size): unlike states before that rule
            opts["max_upsample_counts"] = "floor"
        if "spread_copies" not in opts or self.opts.shapes or self.opts.pack_shape or self.opts.compat == "fairseq":
            # read by dynamic batches spreading copies only; there, its presence also tells a state written by the
            # placement before it (batches cut otherwise) from one of this placement
            opts.pop("max_repeats")
        return opts

    def fingerprint(self, legacy: bool = False) -> str:
        """The data (each component's size hashes: another tokenizer or an edited file changes them, a moved
        folder does not) and every setting that shapes the plan. ``legacy``: as babelfeed wrote it before states
        recorded how updates were counted (with the batches per update of a changing schedule)."""
        comps = [(c.key, c.shard, len(c), c.src_prefix.tolist(), c.tgt_prefix.tolist(), data_digest(c.src),
                  data_digest(c.tgt)) for c in self.sources.components]
        # the world size and accumulation count updates, which a state records (update_segments): a run resumes
        # on another world size, schedule or not
        opts = self._stated_opts(with_updates=legacy and self.changing_schedule)
        blob = json.dumps({"opts": opts, "split": self.sources.split, "shards": self.sources.shards,
                           "components": comps}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
