"""The translation iterator: one rank's batches of the planned epochs, with exact resume.

Global batch g of an epoch is served by rank ``g % world_size`` (``split="batches"``), or every rank takes its
rows of every global batch (``split="rows"``). The state is a handful of integers: the epoch and the number of
global batches consumed (plus, with the stream sampler, every stream's position when the epoch began), so a run
resumes bit-identically in a fresh process, and on a different world size from the same global position.

When an epoch's batch count is not a multiple of the world size, the last step is completed with fully masked
batches (every ``weight`` 0, ``ntokens`` 0): every rank takes the same number of steps, no rank waits in a
collective, and no sample is dropped or carried into a different epoch (which would make an epoch's content
depend on the world size).
"""

from __future__ import annotations

import math

import numpy as np

from babelfeed.errors import ConfigError, OutOfRange, SkipError, UsageError
from babelfeed.gather.collate import Collater
from babelfeed.iterators.ledger import check_trace_state, describe_ids, trace
from babelfeed.iterators.protocol import LoaderIterator
from babelfeed.iterators.replay import step_batch
from babelfeed.iterators.reports import Reports
from babelfeed.iterators.state import find_state, resolve
from babelfeed.iterators.translation_ledger import PlanLedger
from babelfeed.iterators.translation_skips import TranslationSkips
from babelfeed.iterators.translation_state import TranslationState
from babelfeed.plan.planner import EpochPlanner, Window
from babelfeed.run.history import upgrade
from babelfeed.run.layout import Layout
from babelfeed.run.weights import Weights
from babelfeed.stages import timed


def _round_up(n: int, multiple: int) -> int:
    return n if multiple <= 1 or n % multiple == 0 else n + multiple - n % multiple


class BatchIterator(TranslationState, PlanLedger, TranslationSkips, Reports, LoaderIterator):
    """Batches of the current epoch for one rank, with ``len()``, ``epoch``, ``step`` and exact resume.

    ``split="batches"`` (data parallelism with one batch per rank, torch DDP): global batch g of an epoch goes to
    rank ``g % world_size``. ``split="rows"`` (one global batch per step, JAX multi-host): every rank takes its
    rows ``[r N/W, (r+1) N/W)`` of every global batch, padded to the batch-wide widths, so the per-host pieces
    assemble into one global array; masked rows (weight 0) make N a multiple of W where needed. Either way the
    global order does not depend on the world size. Iterating past the epoch's last step raises StopIteration
    and moves to the next epoch, so ``for epoch ...: for batch in it: ...`` walks epoch after epoch.
    """

    kind = "translation"

    def __init__(self, planner: EpochPlanner, collater: Collater, rank: int = 0, world_size: int = 1,
                 epoch: int = 1, name: str = "train", max_epochs: int | None = None, split: str = "batches"):
        super().__init__(rank, world_size, split, streams=len(planner.keys))
        if split == "rows" and planner.opts.pack_shape and planner.rows_per_packed_batch() % world_size:
            raise ConfigError(f"packed batches of {planner.rows_per_packed_batch()} rows cannot be split evenly over "
                              f"{world_size} ranks")
        self._per_step = world_size if split == "batches" else 1
        # split="rows": a global batch's rows are a multiple of this (masked rows fill up); the JAX adapter makes
        # it a multiple of the devices on the mesh's data axes too, so every device gets the same rows
        self.row_multiple = world_size
        if epoch < 1:
            raise UsageError(f"epochs count from 1, got {epoch}")
        self.planner, self.collater = planner, collater
        self.name = self.record.name = name
        self.record.weights = Weights.bind(planner)  # (the planner mixes with them, the record saves them)
        self.max_epochs = max_epochs
        self.epoch = epoch
        self._base = 0  # global batches consumed before this run's first step of the epoch
        self.step = 0  # steps taken by every rank since _base
        self._hint = (0, 0)
        # where random access found its last batch, (epoch, window, its first batch), per user: "ra" (batch_at,
        # has_batch) and "ahead" (the prefetcher); emptied whenever the plans change
        self._ra_hint: dict[str, tuple] = {}
        self.total_steps = 0
        self.served: dict[int, np.ndarray] = {}  # epoch -> samples served by this rank, per direction
        self._fillers: dict = {}  # (epoch, window, skips in force, shape, skips) -> the filler sample (_filler)
        self._skip_ledger: dict = {}  # skipped_in's counts: whole windows, and where its last call stood

    # ----------------------------------------------------------------------------------------- counters
    @property
    def consumed(self) -> int:
        """Global batches of this epoch consumed by all ranks together."""
        return self._base + self.step * self._per_step

    def __len__(self) -> int:
        """Steps of the current epoch for this rank, counted from the epoch's start (the first call plans the
        integers of every window of the epoch)."""
        n = self.planner.num_batches(self.epoch)
        before_resume = -(-self._base // self._per_step)
        return before_resume + -(-max(n - self._base, 0) // self._per_step)

    @property
    def batches_per_step(self) -> int:
        """Global batches one step takes from the epoch (the world size for ``split="batches"``, else 1)."""
        return self._per_step

    def steps_after(self, base: int) -> int:
        """This rank's batches from global batch ``base`` of the current epoch to its end (plans every window)."""
        n = self.planner.num_batches(self.epoch)
        return -(-max(n - int(base), 0) // self._per_step)

    def has_batch(self, k: int, base: int | None = None) -> bool:
        """Whether this rank has a k-th batch in the current epoch: ``0 <= k < len(self)``, planning only the
        windows up to it. With ``base``: the k-th batch counted from global batch ``base`` of the epoch (a
        position saved at another world size), as :meth:`batch_at` takes it."""
        if k < 0:
            return False
        if base is not None:
            return base >= 0 and self._locate(int(base) + k * self._per_step) is not None
        if self._base % self._per_step:  # resumed between steps on another world size: count them all
            return k < len(self)
        return self._locate(k * self._per_step) is not None

    def _locate(self, g: int, user: str = "ra"):
        """``planner.locate`` for random access, starting from the window ``user`` found last (not from window
        0). A batch served before the run's last mixture edit (``plan.parts``) is ``(-1, -1)``: it existed, and
        this plan does not make it."""
        if g < self.planner.first_batch(self.epoch):
            return -1, -1
        epoch, w, start = self._ra_hint.get(user, (0, 0, 0))
        where = self.planner.locate(self.epoch, g, (w, start) if epoch == self.epoch else (0, 0))
        if where is not None:
            self._ra_hint[user] = (self.epoch, where[0], g - where[1])
        return where

    @property
    def iterations_in_epoch(self) -> int:
        return -(-self._base // self._per_step) + self.step

    @timed("batch")
    def __next__(self) -> dict:
        if self.max_epochs is not None and self.epoch > self.max_epochs:
            raise StopIteration
        start = self.consumed
        if self.step == 0 and self._base == 0 and self.epoch > 1:  # an epoch's first batch: the data still its own
            self.planner.sources.check_unchanged()
        if self.planner.locate(self.epoch, start, self._hint) is None:
            self._next_epoch()
            raise StopIteration
        g = start + (self.rank if self.split == "batches" else 0)
        where = self.planner.locate(self.epoch, g, self._hint)
        if where is None:  # the epoch's last step: ranks past its end get a fully masked batch
            batch = self._dummy()
        else:
            w, j = where
            if self._hint[0] != w or j == 0:  # a window's first batch here: its files still whole
                self.planner.sources.spaces.check_sizes()
            self._hint = (w, self.planner.window_start(self.epoch, w))
            batch = self._collate(w, j, at=(self.step, self._base, 1))  # (in order: every batch of this rank)
        self.step += 1
        self.total_steps += 1
        return batch

    def _collate(self, w: int, j: int, weight=None, at: tuple | None = None) -> dict:
        """The j-th batch of window w (this rank's rows of it with split="rows"); ``weight`` (zeros) marks an
        epoch-padding batch, which counts as nothing. ``at``: ``(k, base[, stride])``, this rank's k-th batch from
        global batch ``base`` (this process making every stride-th): with remote data, its rows and those of the batches after it are fetched ahead first
        (:class:`~babelfeed.iterators.fetch_ahead.FetchAhead`)."""
        spaces = self.collater.sources.spaces
        if not spaces.remote:
            return self._collate_one(w, j, weight)

        due = self._clock(self.planner.window_start(self.epoch, w) + j)  # (the fetcher's clock: this batch's)
        ready = at is not None and self._fetch_ahead().before(at[0], at[1], self.epoch, at[2] if len(at) > 2 else None,
                                                             due)
        reading = spaces.reading(due=due, prefetched=ready and self.planner.window(self.epoch, w).packed is None)
        return self._collate_one(w, j, weight, reading)

    def _clock(self, g: int) -> float:
        """Global batch g of this epoch on one scale across epochs (the fetcher's cache keeps what is due
        soonest)."""
        return float(self.epoch * 2**40 + g)

    def _fetch_shares(self) -> tuple[dict, int, int]:
        """``{path: (share, rows, inode)}``: the share of each remote ``.bin``'s rows this rank reads this epoch (a
        direction's passes, capped at one, over the ranks: each reads its own batches or rows), the rows the
        file holds and the file the dataset opened; the ranks, and this one."""
        setup = self.planner.setup(self.epoch)
        counts = setup.counts if setup.counts.sum() else setup.expected
        out: dict = {}
        if counts is None:
            return out, self.world_size, self.rank
        for d, direction in enumerate(setup.directions):
            share = min(1.0, float(counts[d]) / max(direction.size, 1)) / self.world_size
            for c in direction.components:
                for ds in (c.src, c.tgt):
                    if ds is not None:
                        out[ds.data_file] = (max(out.get(ds.data_file, (0.0,))[0], share), len(ds), ds.bin_inode)
        return out, self.world_size, self.rank

    def _fetch_rows(self, ks: range, base: int) -> tuple[list, int]:
        """The remote byte ranges (each with its batch's clock) of this rank's batches ``ks`` counted from global
        batch ``base``, and how many of them the epoch has. Rows of packed windows are left to the gather."""
        off = self.rank if self.split == "batches" else 0
        found: dict[int, list] = {}
        got = 0
        for k in ks:
            g = base + k * self._per_step + off
            where = self._locate(g, "ahead")
            if where is None:
                break
            if where == (-1, -1):  # (served before the run's last edit)
                continue
            found.setdefault(where[0], []).append((where[1], g))
            got += 1
        files: list = []
        for w, items in found.items():
            win = self.planner.window(self.epoch, w)
            if win.packed is not None:
                continue
            js = np.array([j for j, _ in items], np.int64)
            clocks = np.array([self._clock(g) for _, g in items])
            if self.split == "rows" and self.world_size > 1:  # this rank's rows of each batch
                for j, c in zip(js.tolist(), clocks.tolist()):
                    s = self._served(win, j)[0]
                    files += self.collater.ranges(s, np.full(len(s), c))
                continue
            idx = win.batch_rows(js)
            self._addresses(win, idx)
            s = win.samples[idx]
            s.addr = win.addr[idx]
            files += self.collater.ranges(s, np.repeat(clocks, win.batch_sizes(js)))
        return files, got

    def _collate_one(self, w: int, j: int, weight=None, spaces=None) -> dict:
        """The j-th batch of window w (this rank's rows of it with split="rows"); ``weight`` (zeros) marks an
        epoch-padding batch, which counts as nothing."""
        win = self.planner.window(self.epoch, w)
        if win.packed is not None:
            return self._collate_packed(win, j, win.batch(j), weight, spaces)
        s, weight, pad_to, sort, empty = self._served(win, j, weight)
        batch = self.collater(s, weight=weight, pad_to_length=pad_to, sort=sort, epoch=self.epoch, spaces=spaces)
        batch["nsentences"] = int((batch["weight"] > 0).sum())
        if empty:  # every row skipped: the filler rows name no sample
            batch["id"] = np.full_like(batch["id"], -1)
        self._count_served(s.direction[weight > 0])
        return batch

    def _served(self, win: Window, j: int, weight=None) -> tuple:
        """(samples, weights, widths to pad to, whether the collater sorts) of this rank's rows of served batch j:
        masked rows appended, and with split="rows" the global batch ordered and this rank's slice of it taken."""
        sl = win.batch(j)
        s = self._samples(win, sl, j)
        n = sl.stop - sl.start
        weight = np.ones(n, np.float32) if weight is None else np.asarray(weight, np.float32)
        shape_idx, masked = win.batch_shape(j)
        empty = False
        if self.skips:  # rows the run's skips drop leave the batch (babelfeed.run.skips)
            s, weight, masked, empty = self._drop_skipped(win, j, s, weight, masked, shape_idx)
            n = len(s)
        pad_to = None
        if shape_idx >= 0:
            shape = self.planner.opts.shapes[shape_idx]
            pad_to = {"source": shape[1], "target": shape[-1]}
        if self.split == "rows":
            masked += (-(n + masked)) % math.lcm(self.row_multiple, self.row_blocks[1])
            if pad_to is None:  # every rank pads to the whole batch's widths
                m = self.collater.opts.pad_to_multiple
                pad_to = {"source": _round_up(int(s.src_len.max()), m), "target": _round_up(int(s.tgt_len.max()), m)}
        if masked:  # masked rows repeat real rows (attention stays well-defined) with weight 0
            s = s.concat(s[np.arange(masked) % n])
            weight = np.concatenate([weight, np.zeros(masked, np.float32)])
        sort = None
        if self.split == "rows":  # order the whole global batch first, so the ranks' slices assemble into it
            if self.collater.opts.sort_by_source_length:
                order = np.argsort(-s.src_len.astype(np.int64), kind="stable")
                s = s[order]
                weight = weight[order]
            mine = self._my_rows(len(weight))
            s = s[mine]
            weight = weight[mine]
            sort = False
        return s, weight, pad_to, sort, empty

    def _drop_skipped(self, win: Window, j: int, s, weight, masked: int, shape_idx: int) -> tuple:
        """Served batch j of window ``win`` without the rows the run's skips drop: ``(samples, weights, masked
        rows to add, empty)``. A static shape keeps its rows (the dropped rows' slots become masked copies); a
        batch with no row left is one filler row (dynamic shape) or its shape of weight-0 copies of a sample of
        the window that no skip drops (``empty``)."""
        g = self.planner.window_start(win.epoch, win.index) + j
        drop = self.skips.dropped(self.planner.sources, win.epoch, g, s.comp, s.local)
        if drop is None:
            return s, weight, masked, False
        rows = len(s) + masked
        keep = ~drop
        if keep.any():
            s, weight = s[np.flatnonzero(keep)], weight[keep]
            return s, weight, (rows - len(s) if shape_idx >= 0 else masked), False
        filler = self._filler(win, g, shape_idx)
        return filler, np.zeros(1, np.float32), (rows - 1 if shape_idx >= 0 else 0), True

    def _filler(self, win: Window, g: int, shape_idx: int):
        """One sample of the epoch that no skip drops at global batch g (of this window, else of the epoch's
        other windows) and that fits shape ``shape_idx`` (-1: any): the shortest. The rows of an all-skipped
        batch are its copies, with weight 0, so no skipped sample's tokens reach the model."""
        shape = self.planner.opts.shapes[shape_idx] if shape_idx >= 0 else None
        n_force = self.skips.in_force(win.epoch, g)
        key = (win.epoch, win.index, n_force, shape_idx, len(self.skips.events))
        cache = self._fillers
        if key in cache:
            return cache[key]
        found = next((f for f in (self._filler_in(x, n_force, shape) for x in self._filler_windows(win))
                      if f is not None), None)
        if found is None:
            raise SkipError(f"every sample of epoch {win.epoch} and the epochs after it that fits its batch shapes is "
                            f"skipped: no sample is left to fill its empty batches (a skip 'where' that matches the "
                            f"whole mixture?)")
        fwin, i = found
        idx = np.array([i], np.int64)
        self._addresses(fwin, idx)
        out = fwin.samples[idx]
        out.addr = fwin.addr[idx]
        if len(cache) > 64:
            cache.clear()
        cache[key] = out
        return out

    def _filler_windows(self, win: Window):
        """The windows a filler sample is looked for in, in order: ``win``, the epoch's earlier windows, its later
        ones, then (every batch of the epoch skipped) the next epochs', which any process can plan."""
        planner = self.planner
        yield win
        for w in range(win.index):
            yield planner.window(win.epoch, w)
        for epoch in range(win.epoch, win.epoch + 4):
            if self.max_epochs is not None and epoch > self.max_epochs:
                return
            setup, w = planner.setup(epoch), (win.index + 1 if epoch == win.epoch else 0)
            while planner._exists(setup, w):
                yield planner.window(epoch, w)
                w += 1

    def _filler_in(self, win: Window, n_force: int, shape) -> tuple | None:
        """(window, sample index) of the shortest sample of ``win`` that no skip drops and that fits ``shape``."""
        s = win.samples
        ok = np.ones(len(s), bool)
        start = self.planner.window_start(win.epoch, win.index)
        for e, lo, hi in self.skips.step_ranges():  # the rows of skipped steps' batches in this window
            a, b = max(lo - start, 0), min(hi - start, len(win))
            if e == win.epoch and a < b:
                ok[win.batch_rows(np.arange(a, b))] = False
        if n_force:
            dropped = self.skips.rows_dropped(self.planner.sources, n_force, s.comp, s.local)
            if dropped is not None:
                ok &= ~dropped
        if shape is not None:
            ok &= (s.src_len <= shape[1]) & (s.tgt_len <= shape[-1])
        if not ok.any():
            return None
        cand = np.flatnonzero(ok)
        size = np.maximum(s.src_len[cand], s.tgt_len[cand])
        return win, int(cand[np.argmin(size)])

    def _samples(self, win: Window, sl: slice, j: int):
        """The planned samples of served batch j (slice ``sl``), with their token addresses. A batch whose
        addresses are missing looks them up together with the batches this rank serves next: 256 batches the
        first time in a window, twice as many each time after (grouped by component, each component's pointers
        read once per lookup), so the first batch waits for a few thousand lookups, not the window's million,
        and a window takes a handful of lookups. Random access looks up what it needs the same way."""
        if win.addr is None or (win.addr[sl, 0] < 0).any():
            step = 1 if self.split == "rows" or self.world_size == 1 else self.world_size
            win.addr_ahead = min(max(256, 2 * win.addr_ahead), len(win))
            self._addresses(win, win.batch_rows(np.arange(j, min(len(win), j + step * win.addr_ahead), step)))
        s = win.samples[sl]
        s.addr = win.addr[sl]
        return s

    def _addresses(self, win: Window, idx: np.ndarray) -> None:
        """Look up the token addresses of window samples ``idx`` that the window does not know yet."""
        if win.addr is None:
            win.addr = np.full((len(win.samples), 2), -1, np.int64)
        idx = idx[win.addr[idx, 0] < 0]
        if len(idx):
            win.addr[idx] = self.collater.addresses(win.samples.comp[idx], win.samples.local[idx])

    def _count_served(self, dirs: np.ndarray) -> None:
        n = len(self.planner.keys)
        served = self.served.get(self.epoch)
        if served is None:
            served = self.served[self.epoch] = np.zeros(n, np.int64)
        served += np.bincount(dirs, minlength=n)

    def _collate_packed(self, win: Window, j: int, sl: slice, weight, spaces=None) -> dict:
        b = int(win.order[j])
        n_rows = self.planner.rows_per_packed_batch()
        masked = int(win.masked[b])
        real_rows = n_rows - masked
        s = self._samples(win, sl, j)
        place = {k: v[sl] for k, v in win.packed.items()}
        row_weight = np.concatenate([np.ones(real_rows, np.float32), np.zeros(masked, np.float32)])
        if weight is not None and not np.any(weight):
            row_weight[:] = 0  # an epoch-padding batch
        empty = False
        if self.skips:  # pairs the run's skips drop leave their rows (babelfeed.run.skips)
            g = self.planner.window_start(win.epoch, win.index) + j
            drop = self.skips.dropped(self.planner.sources, win.epoch, g, s.comp, s.local)
            if drop is not None and (~drop).any():
                keep = np.flatnonzero(~drop)
                s, place = s[keep], {k: v[keep] for k, v in place.items()}
            elif drop is not None:  # every pair: one filler pair, weight 0
                s, empty = self._filler(win, g, -1), True
                place = {k: np.zeros(1, np.int64) for k in place}
        live = np.unique(place["row"])
        holes = np.setdiff1d(np.arange(n_rows), live)  # rows left without a pair (masked rows included)
        row_weight[holes] = 0
        if empty:
            row_weight[:] = 0
        if len(holes):  # repeat real rows (attention stays well-defined), weight 0
            pick = [np.flatnonzero(place["row"] == live[i % len(live)]) for i in range(len(holes))]
            extra = np.concatenate(pick)
            new_rows = np.concatenate([np.full(len(p), holes[i]) for i, p in enumerate(pick)])
            s = s.concat(s[extra])
            place = {"row": np.concatenate([place["row"], new_rows]),
                     "src_offset": np.concatenate([place["src_offset"], place["src_offset"][extra]]),
                     "tgt_offset": np.concatenate([place["tgt_offset"], place["tgt_offset"][extra]])}
        place["src_len"], place["tgt_len"] = s.src_len.astype(np.int64), s.tgt_len.astype(np.int64)
        if self.split == "rows":  # this rank's rows of the packed batch, renumbered from 0
            mine = self._my_rows(n_rows)
            local = np.full(n_rows, -1, np.int64)
            local[mine] = np.arange(len(mine))
            keep = local[place["row"]] >= 0
            s = s[keep]
            place = {k: (local[v[keep]] if k == "row" else v[keep]) for k, v in place.items()}
            row_weight = row_weight[mine]
        batch = self.collater.packed(s, place, tuple(self.planner.opts.pack_shape), row_weight, spaces)
        if empty:
            batch["id"] = np.full_like(batch["id"], -1)
        self._count_served(s.direction[row_weight[place["row"]] > 0])
        return batch

    def batch_at(self, k: int, base: int = 0) -> dict:
        """This rank's k-th batch of the current epoch, by random access (for worker pools such as grain's);
        counted from global batch ``base`` of the epoch (0: its start).

        Does not move the iterator; batches of one window are cheapest when asked for in order. Plans only the
        windows up to batch k (``IndexError`` past the epoch's end), so a worker pool starts without the epoch's
        length.
        """
        if not self.has_batch(k, base if base else None):
            raise OutOfRange(f"batch {k} (from global batch {base}) out of range: this rank has "
                             f"{self.steps_after(base)} batches from there in epoch {self.epoch}")
        g = base + k * self._per_step + (self.rank if self.split == "batches" else 0)
        where = self._locate(g)
        if where == (-1, -1):
            first = self.planner.first_batch(self.epoch)
            raise OutOfRange(f"batch {k} (global batch {g} of epoch {self.epoch}) was served before this run's "
                             f"mixture edit, which began at global batch {first}: count from there (base={first})")
        return self._dummy() if where is None else self._collate(*where, at=(k, base))

    def _dummy(self) -> dict:
        n = self.planner.num_batches(self.epoch)
        w, j = self.planner.locate(self.epoch, n - 1)
        win = self.planner.window(self.epoch, w)
        sl = win.batch(j)
        batch = self._collate(w, j, weight=np.zeros(sl.stop - sl.start, np.float32))
        batch["id"] = np.full_like(batch["id"], -1)
        batch["nsentences"] = 0
        return batch

    def _next_epoch(self) -> None:
        self.epoch += 1
        self._base = 0
        self.step = 0
        self._hint = (0, 0)
        self._ra_hint = {}

    def describe_ids(self, ids) -> list:
        """Where each sample of a batch came from: per ``id``, ``{"id", "stream", "task", "corpus", "shard",
        "row"}`` (``None`` for -1, an epoch-padding row). ``row`` is the record in that shard's ``.idx``. Ids keep
        their meaning across the run's edits (``run.layout``): one of a stream an edit removed still names it."""
        layout = self.record.layout
        return describe_ids(self.planner.sources, self.collater.id_base, np.asarray(ids, np.int64).reshape(-1),
                            layout.removed(self.planner) if layout is not None else ())

    @property
    def stream_names(self) -> list[str]:
        """What a batch's ``direction`` numbers: every stream of the run, in the order it first came (the config's
        streams, then those an edit added; a stream an edit removed keeps its number)."""
        layout = self.record.layout
        return list(layout.streams) if layout is not None else list(self.planner.keys)

    def use_layout(self, layout) -> None:
        """Number ids and streams by ``layout`` (``run.layout``; None: the config's plain numbering)."""
        if layout is not None and layout.is_plain(self.planner):
            layout = None
        self.record.layout = layout
        if layout is None:
            Layout.plain(self.planner).apply(self.collater, self.planner)
            self.collater.stream_index = None
        else:
            layout.apply(self.collater, self.planner)

    def weight_names(self) -> list[str]:
        return list(self.planner.sources.tasks)

    def _set_weights(self, weights: dict):
        """``set_weights``: the stream sampler's windows from the next one on; the other samplers' an edit of the
        config's task weights (``mixing.schedule.weights``) from the next step."""
        tasks = self.planner.sources.tasks
        if not self.planner.sampler.streams:  # (the weights in force already: nothing to do, None)
            return self._edit(None, {"mixing.schedule.weights": ",".join(f"{t}:{weights[t]!r}" for t in tasks),
                                     "mixing.schedule.boundaries": ""}, unchanged_ok=True)
        self.planner.set_weights(self.planner.since_start(self.epoch, self.consumed),
                                 [float(weights[t]) for t in tasks])
        self._hint = (0, 0)
        self._ra_hint = {}

    def batch_for_step(self, step: int, state: dict | None = None, rank: int | None = None) -> dict:
        """The batch rank ``rank`` (default: this iterator's) received at training step ``step`` (1-based, since
        training began), rebuilt exactly, leaf for leaf, without serving the steps before it. ``state``: the
        run's latest state (default: this iterator's own), whose history answers any step: across mixture edits,
        weight changes, skips and resumes on other world sizes (``rank`` counts the ranks of the world size that
        took the step). With ``split="rows"``, the rank's block of that many equal row blocks (the JAX adapter
        may hand a process other blocks: ``take_row_blocks``). This iterator's position is left as it was."""
        if state is None:
            state = self.get_state()
        else:
            state = upgrade(find_state(state, "state"))
            if not state.get("version"):  # a bare loader position: the run's state there
                state = resolve(state, self)
            check_trace_state(self, state)
        return step_batch(self, step, state, rank)

    def _trace(self, step: int, state: dict | None) -> list:
        return trace(self, step, state)

    def epoch_batches(self, epoch: int) -> int:
        return self.planner.num_batches(epoch)

    def position(self) -> tuple[int, int]:
        return self.epoch, self.consumed

    def _seek(self, epoch: int, consumed: int, total_steps: int) -> None:
        """Stand at global batch ``consumed`` of ``epoch`` after ``total_steps`` steps, serving nothing (the
        history replay moves an iterator of a finished segment to where the run was saved)."""
        part = self.planner.part
        if part is not None and (int(epoch), int(consumed)) < (part.epoch, part.batch):
            raise UsageError(f"epoch {epoch}, global batch {consumed} lies before this run's mixture edit (epoch "
                             f"{part.epoch}, global batch {part.batch}), which this iterator plans from")
        self.epoch, self._base, self.step = int(epoch), int(consumed), 0
        self.total_steps = int(total_steps)
        self._hint, self._ra_hint = (0, 0), {}

    # ----------------------------------------------------------------------------------------- state
    def datasets(self) -> list:
        return [ds for c in self.planner.sources.components for ds in (c.src, c.tgt) if ds is not None]

    def dictionaries(self) -> list:
        return [self.planner.sources.dictionary]

    def fingerprint(self) -> str:
        return self.planner.fingerprint()

    def fingerprints(self) -> tuple:
        return (self.planner.fingerprint(), self.planner.fingerprint(legacy=True))

    def identity(self) -> dict:
        return self.planner.identity()
