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

import copy
import math

import numpy as np

from babelfeed.gather.collate import Collater
from babelfeed.iterators.protocol import MAX_EPOCHS_AHEAD, STATE_VERSION, LoaderIterator
from babelfeed.plan.planner import EpochPlanner, Window
from babelfeed.iterators.reports import Reports
from babelfeed.iterators.skips import Skips


def _round_up(n: int, multiple: int) -> int:
    return n if multiple <= 1 or n % multiple == 0 else n + multiple - n % multiple


class BatchIterator(Reports, LoaderIterator):
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
        super().__init__(rank, world_size, split)
        if split == "rows" and planner.opts.pack_shape and planner.rows_per_packed_batch() % world_size:
            raise ValueError(f"packed batches of {planner.rows_per_packed_batch()} rows cannot be split evenly over "
                             f"{world_size} ranks")
        self._per_step = world_size if split == "batches" else 1
        # split="rows": a global batch's rows are a multiple of this (masked rows fill up); the JAX adapter makes
        # it a multiple of the devices on the mesh's data axes too, so every device gets the same rows
        self.row_multiple = world_size
        if epoch < 1:
            raise ValueError(f"epochs count from 1, got {epoch}")
        self.planner, self.collater = planner, collater
        self.name = name
        self.max_epochs = max_epochs
        self.epoch = epoch
        self._base = 0  # global batches consumed before this run's first step of the epoch
        self.step = 0  # steps taken by every rank since _base
        self._ledger_start: dict[int, np.ndarray] = {1: np.zeros((3, len(planner.keys)), np.int64)}
        self._skipped_start: dict = {1: np.zeros((3, len(planner.keys)), np.int64)}  # (see skipped_start)
        self._skipped_other: dict = {}  # skipped counts of streams an edit removed, as the state kept them
        self.dormant: dict = {}  # streams an edit removed: name -> position and ledger counts, kept in the state
        self.edits: list = []  # the mixture edits of this run: step, epoch, global batch, what changed
        # how steps were counted: [steps before, epoch, global batch, world size] each time the world size changed
        self.step_log: list = []
        self._hint = (0, 0)
        # where random access found its last batch, (epoch, window, its first batch), per user: "ra" (batch_at,
        # has_batch) and "ahead" (the prefetcher); emptied whenever the plans change
        self._ra_hint: dict[str, tuple] = {}
        self.total_steps = 0
        self.served: dict[int, np.ndarray] = {}  # epoch -> samples served by this rank, per direction
        self.skips = Skips()  # what the run leaves out, from which step on (it.skip; babelfeed.iterators.skips)
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
        from babelfeed.storage.remote import set_clock

        set_clock(self._clock(self.planner.window_start(self.epoch, w) + j))
        ready = at is not None and self._fetch_ahead().before(at[0], at[1], self.epoch, at[2] if len(at) > 2 else None)
        spaces.prefetched = ready and self.planner.window(self.epoch, w).packed is None
        try:
            return self._collate_one(w, j, weight)
        finally:
            spaces.prefetched = False

    def _clock(self, g: int) -> float:
        """Global batch g of this epoch on one scale across epochs (the fetcher's cache keeps what is due
        soonest)."""
        return float(self.epoch * 2**40 + g)

    def _fetch_shares(self) -> tuple[dict, int, int]:
        """``{path: (share, rows)}``: the share of each remote ``.bin``'s rows this rank reads this epoch (a
        direction's passes, capped at one, over the ranks: each reads its own batches or rows) and the rows the
        file holds; the ranks, and this one."""
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
                        out[ds.data_file] = (max(out.get(ds.data_file, (0.0,))[0], share), len(ds))
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

    def _collate_one(self, w: int, j: int, weight=None) -> dict:
        """The j-th batch of window w (this rank's rows of it with split="rows"); ``weight`` (zeros) marks an
        epoch-padding batch, which counts as nothing."""
        win = self.planner.window(self.epoch, w)
        if win.packed is not None:
            return self._collate_packed(win, j, win.batch(j), weight)
        s, weight, pad_to, sort, empty = self._served(win, j, weight)
        batch = self.collater(s, weight=weight, pad_to_length=pad_to, sort=sort, epoch=self.epoch)
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
        if self.skips:  # rows the run's skips drop leave the batch (babelfeed.iterators.skips)
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
            from babelfeed.iterators.skips import SkipError

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

    def _collate_packed(self, win: Window, j: int, sl: slice, weight) -> dict:
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
        if self.skips:  # pairs the run's skips drop leave their rows (babelfeed.iterators.skips)
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
        batch = self.collater.packed(s, place, tuple(self.planner.opts.pack_shape), row_weight)
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
            raise IndexError(f"batch {k} (from global batch {base}) out of range: this rank has "
                             f"{self.steps_after(base)} batches from there in epoch {self.epoch}")
        g = base + k * self._per_step + (self.rank if self.split == "batches" else 0)
        where = self._locate(g)
        if where == (-1, -1):
            first = self.planner.first_batch(self.epoch)
            raise IndexError(f"batch {k} (global batch {g} of epoch {self.epoch}) was served before this run's "
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

    # ----------------------------------------------------------------------------------------- ledger
    def ledger_start(self, epoch: int) -> np.ndarray:
        """The ledger's totals when ``epoch`` began (from the state, or every earlier epoch's plan)."""
        if epoch not in self._ledger_start:
            from tqdm.auto import tqdm

            known = max(e for e in self._ledger_start if e < epoch)
            totals = self._ledger_start[known].copy()
            # (a state without a ledger, an older babelfeed's, many epochs on: counted from every epoch's plan)
            for e in tqdm(range(known, epoch), desc="counting the ledger of earlier epochs", unit="epoch",
                          disable=epoch - known < 50, leave=False):
                n = self.planner.num_batches(e)
                totals += self.planner.consumed_totals(e, n) - self.skipped_in(e, n)
                self._ledger_start[e + 1] = totals.copy()
        return self._ledger_start[epoch]

    def ledger_totals(self, epoch: int | None = None, consumed: int | None = None) -> tuple:
        """``(epoch, int64[3, streams] totals, steps, skipped)`` at this iterator's position (or at ``epoch``,
        ``consumed``): what :meth:`ledger` reports, as arrays (cheap to take after every batch). ``totals``
        counts what was served, ``skipped`` (the same shape; None while nothing was skipped) what the run's skips
        dropped, never served."""
        epoch = self.epoch if epoch is None else epoch
        consumed = self.consumed if consumed is None else consumed
        totals = self.ledger_start(epoch) + self.planner.consumed_totals(epoch, consumed)
        if not self.skips:
            return epoch, totals, self.total_steps, None
        inside = self.skipped_in(epoch, consumed)
        return epoch, totals - inside, self.total_steps, self.skipped_start(epoch) + inside

    # what the skips dropped: at each epoch's start (from the state, else counted), and inside an epoch
    def skipped_start(self, epoch: int) -> np.ndarray:
        """The skipped rows' totals (int64[3, streams]) when ``epoch`` began."""
        if epoch not in self._skipped_start:
            known = max(e for e in self._skipped_start if e < epoch)
            totals = self._skipped_start[known].copy()
            for e in range(known, epoch):
                totals += self.skipped_in(e, self.planner.num_batches(e))
                self._skipped_start[e + 1] = totals.copy()
        return self._skipped_start[epoch]

    def skipped_totals(self, epoch: int, consumed: int) -> np.ndarray | None:
        """What the skips dropped from global batches before ``consumed`` of ``epoch`` since training began,
        per stream (int64[3, streams]); None when the run made no skip."""
        if not self.skips:
            return None
        return self.skipped_start(epoch) + self.skipped_in(epoch, consumed)

    def skipped_in(self, epoch: int, consumed: int) -> np.ndarray:
        """The rows the skips drop from global batches ``[0, consumed)`` of ``epoch``, per stream: whole windows
        counted once (cached), the window in progress from where the last call left it."""
        planner, skips = self.planner, self.skips
        streams = len(planner.keys)
        zeros = np.zeros((3, streams), np.int64)
        if not skips or not self._skips_reach(epoch):
            return zeros
        version = (len(skips.events), id(skips))
        cache = self._skip_ledger
        if cache.get("version") != version:
            cache.clear()
            cache["version"] = version
        windows = cache.setdefault("windows", {})

        def whole(w: int, start: int, n: int) -> np.ndarray:  # (a whole window's, counted once)
            if (epoch, w) not in windows:
                windows[(epoch, w)] = self._dropped_totals(planner.window(epoch, w), start, 0, n)
            return windows[(epoch, w)]

        total, cache["hint"] = planner.sum_batches(
            epoch, consumed, cache.get("hint"), whole,
            lambda w, start, j0, j1: self._dropped_totals(planner.window(epoch, w), start, j0, j1))
        return total

    def _skips_reach(self, epoch: int) -> bool:
        """Whether any skip drops rows in ``epoch`` (a step range in it, or a row skip made by its end)."""
        if any(e == epoch for e, _, _ in self.skips.step_ranges()):
            return True
        return any(e["epoch"] <= epoch for e in self.skips.row_events)

    def _dropped_totals(self, win: Window, start: int, j0: int, j1: int) -> np.ndarray:
        """Per stream, the rows the skips drop from served batches ``[j0, j1)`` of window ``win`` (its first
        global batch is ``start``)."""
        from babelfeed.plan.totals import window_totals

        rows, _ = self.dropped_rows(win, start, j0, j1)
        s = win.samples
        return window_totals(s.direction[rows], s.src_len[rows], s.tgt_len[rows], len(self.planner.keys))

    def dropped_rows(self, win: Window, start: int, j0: int, j1: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows (indices into ``win.samples``) of served batches ``[j0, j1)`` of window ``win`` (its first
        global batch is ``start``) that the run's skips drop, and per row the skip that drops it (its index in
        ``skips.events``)."""
        js = np.arange(j0, j1)
        rows = win.batch_rows(js)
        g = np.repeat(start + js, win.batch_sizes(js))
        s = win.samples
        which = self.skips.which(self.planner.sources, win.epoch, g, s.comp[rows], s.local[rows])
        hit = which >= 0
        return rows[hit], which[hit]

    def ledger(self, prefix: str = "ledger", at: tuple | None = None) -> dict:
        """What every rank together has consumed up to this iterator's position, per stream, since training
        began: a flat dict of numbers to log as is (``{prefix}/{stream}/samples``, ``src_tokens``,
        ``tgt_tokens``, ``passes``; ``{prefix}/samples``, ``tokens``, ``epoch``, ``step``). The same on every
        rank at the same step; counted from the plan (see ``babelfeed.ledger``). ``at``: a
        :meth:`ledger_totals` taken earlier (the adapters' read-ahead threads take one per batch)."""
        from babelfeed.iterators.ledger import FIELDS, flat

        epoch, totals, steps, skipped = self.ledger_totals() if at is None else at
        keys = list(self.planner.keys)
        rows = np.zeros(len(keys), np.int64)
        index = {k: i for i, k in enumerate(keys)}
        for c in self.planner.sources.components:
            rows[index[c.key]] += len(c)
        # streams an edit removed count on, from the state's dormant streams (so the run's totals never go down)
        extra = [k for k in self.dormant if k not in index]
        keys += extra
        rows = np.concatenate([rows, [self.dormant[k].get("rows", 0) for k in extra]]).astype(np.int64)
        if extra:
            totals = np.concatenate([totals, np.array([[self.dormant[k][f] for k in extra] for f in FIELDS],
                                                      np.int64).reshape(len(FIELDS), len(extra))], axis=1)
        if skipped is not None:
            skipped = np.concatenate([skipped, np.zeros((3, len(keys) - skipped.shape[1]), np.int64)], axis=1)
            for k, counts in self._skipped_other.items():  # (streams an edit removed: as the state kept them)
                if k in keys:
                    skipped[:, keys.index(k)] += counts
        return flat(totals, keys, rows, epoch, steps, prefix, skipped=skipped)

    def describe_ids(self, ids) -> list:
        """Where each sample of a batch came from: per ``id``, ``{"id", "stream", "task", "corpus", "shard",
        "row"}`` (``None`` for -1, an epoch-padding row). ``row`` is the record in that shard's ``.idx``."""
        from babelfeed.iterators.ledger import describe_ids

        return describe_ids(self.planner.sources, self.collater.id_base, np.asarray(ids, np.int64).reshape(-1))

    def set_weights(self, weights: dict):
        """Change the mixture: ``{task: weight}`` for every task (the tasks of the config's tasks section, or
        every direction), normalised; the temperature still splits a task's weight among its corpora. Call it on
        every rank at the same step. The change is recorded in the state, so a resumed run mixes exactly as this
        one, whether it resumes before the change (and makes it again) or after it.

        With ``mixing.sampler="stream"`` it takes effect from the next planning window (the window being served
        keeps its mix; cheap enough for a policy that calls it every few steps). With the other samplers it is an
        edit of the config's task weights (``mixing.schedule.weights``, :meth:`edit`), from the next step: every
        stream goes on from its position, and the edit is reported (its ``EditReport`` is returned)."""
        from babelfeed.iterators.policy import scaled_weights

        tasks = self.planner.sources.tasks
        weights = scaled_weights(weights, tasks, "task")
        if not self.planner.sampler.streams:
            return self.edit(**{"mixing.schedule.weights": ",".join(f"{t}:{weights[t]!r}" for t in tasks),
                                "mixing.schedule.boundaries": ""})
        at = self.planner.since_start(self.epoch, self.consumed) if self.planner.sampler.streams else 0
        self.planner.set_weights(at, [float(weights[t]) for t in tasks])
        self._hint = (0, 0)
        self._ra_hint = {}

    def skip(self, steps=None, ids=None, where=None, reason: str = "", world_size: int | None = None) -> dict:
        """Leave data out of the rest of the run, from the next step on: ``steps`` (a ``range`` of training
        steps, 1-based, not yet taken: every row of their global batches), ``ids`` (samples, by the ``id`` their
        batches carried) or ``where`` (``{"stream" | "task" | "corpus": names, "shard": n or [n, ...], "rows":
        range(lo, hi)}``: every sample matching all the terms given). Exactly one of them; ``reason`` is kept
        with it ("loss spike at step 1234").

        Skipped rows are dropped from their batches and nothing else moves: every other sample keeps its step
        (``babelfeed.iterators.skips`` says what a batch looks like). The skip is recorded in the state's history
        with the step it took effect after, so a run resumed from a later state, on any world size, makes the
        same skip; ``trace``, ``batch_for_step`` and the ledger count with it. After a rollback
        (``set_state(earlier_state)``), a skip of the steps around a spike gives exactly the batches of a run
        that made it at that step from the start. Call it on every rank at the same step. Returns the event
        recorded.

        ``world_size`` (``steps`` only, ``split="batches"``): the world size whose steps ``steps`` counts, where
        it is not this iterator's: a run rolled back onto another number of ranks skips the steps the run that
        spiked took (their global batches). Without it, a state saved on another world size is refused, as the
        steps would name other batches."""
        from babelfeed.iterators.skips import which_kind

        which_kind(steps, ids, where, reason)
        epoch, consumed = self.epoch, self.consumed
        event = {"event": "skip", "step": int(self.total_steps), "epoch": int(epoch), "batch": int(consumed),
                 "reason": reason}
        if steps is not None:
            event.update(self._skip_steps(steps, world_size))
        elif ids is not None:
            event.update(self._skip_ids(ids))
        else:
            event["where"] = self._skip_where(where)
            self._refuse_skipping_everything(event)
        self.skips.add(event)
        self._fillers = {}
        return copy.deepcopy(event)

    def _refuse_skipping_everything(self, event: dict) -> None:
        """Refuse a skip that, with the run's earlier ones, drops every sample of the mixture: no batch could be
        filled any more (and a checkpoint saved after it would hold a run that cannot go on)."""
        from babelfeed.iterators.skips import SkipError

        trial = Skips(self.skips.events + [event])
        code, (base, starts, ends) = trial._rules(self.planner.sources, len(trial.row_events))
        whole = code == 1
        if len(starts):  # components whose every record a range covers
            owner = np.searchsorted(base, starts, side="right") - 1
            covered = np.bincount(owner, weights=(ends - starts).astype(np.float64), minlength=len(code))
            whole |= (code == 2) & (covered >= np.diff(base))
        if len(code) and whole.all():
            raise SkipError(f"where={event['where']}: with the run's earlier skips, this leaves no sample of the "
                            f"mixture to serve; skip less, or edit the mixture (set_state(state, "
                            f"mixture_change='allow') with the corpora to keep)")

    def _skip_steps(self, steps, world_size: int | None = None) -> dict:
        """The global batches of training steps ``steps`` (not yet taken), as this run counts its steps (or a run
        on ``world_size`` ranks would)."""
        from babelfeed.iterators.history import world_size_at
        from babelfeed.iterators.skips import SkipError, step_range

        t = self.total_steps
        a, b = step_range(steps, t)
        if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)
                                       or world_size < 1):
            raise SkipError(f"world_size must be an integer >= 1, got {world_size!r}")
        per = self._per_step
        if self.split == "batches":  # (with split="rows" a step is one global batch on any world size)
            took = world_size_at(self.step_log, t) if t else None  # the world size that took the last step
            if world_size is None and took is not None and took != self.world_size:
                raise SkipError(f"steps {a}..{b - 1}: this iterator runs on {self.world_size} rank(s), and the state "
                                f"it resumed was saved by a run on {took}, whose step {a} holds other global "
                                f"batches. Say whose steps they are: skip(steps=..., world_size={took}) for the steps "
                                f"of the run that was saved (the one that spiked), world_size={self.world_size} for "
                                f"this run's")
            per = world_size or per

        def left(e: int, c: int) -> int:  # steps from global batch c of epoch e to the epoch's end
            if self.max_epochs is not None and e > self.max_epochs:
                raise SkipError(f"steps {a}..{b - 1} lie past the run's last epoch ({self.max_epochs}, max_epochs)")
            return -(-max(self.epoch_batches(e) - c, 0) // per)

        epoch_steps = max(left(self.epoch, 0), 1)
        if b - 1 - t > 2 * MAX_EPOCHS_AHEAD * epoch_steps:  # (about: epochs vary; said before planning them all)
            raise SkipError(f"steps {a}..{b - 1} run about {(b - 1 - t) // epoch_steps:,} epochs ahead (epoch "
                            f"{self.epoch} has {epoch_steps:,} steps); more than {MAX_EPOCHS_AHEAD:,} are refused")
        e, c, k = self.epoch, self.consumed, a - 1 - t
        while k >= left(e, c):  # to step a
            k -= left(e, c)
            e, c = e + 1, 0
            if e - self.epoch > MAX_EPOCHS_AHEAD:
                raise SkipError(f"step {a} lies more than {MAX_EPOCHS_AHEAD:,} epochs ahead")
        c += k * per
        out, k = [], b - a
        while k > 0:
            if e - self.epoch > MAX_EPOCHS_AHEAD:
                raise SkipError(f"steps {a}..{b - 1} run more than {MAX_EPOCHS_AHEAD:,} epochs ahead: skip fewer "
                                f"steps (a corpus or shard is skipped for good with where=)")
            n = left(e, c)
            if n == 0:
                e, c = e + 1, 0
                continue
            take = min(k, n)
            hi = min(c + take * per, self.epoch_batches(e))
            out.append([int(e), int(c), int(hi)])
            k -= take
            e, c = (e + 1, 0) if take == n else (e, hi)
        return {"steps": [a, b], "batches": out, **({"world_size": int(world_size)} if world_size is not None and
                                                     world_size != self.world_size else {})}

    def _skip_ids(self, ids) -> dict:
        """Samples by id, as the records they name (stable across mixture edits that renumber ids)."""
        from babelfeed.iterators.skips import SkipError, as_ranges

        try:
            arr = np.asarray(ids)
        except Exception:
            arr = None
        if arr is None or arr.dtype.kind not in "iu" or arr.size == 0:
            raise SkipError(f"ids must be a non-empty list of sample ids (integers, a batch's 'id'), got "
                            f"{str(ids)[:200]}")
        arr = arr.reshape(-1)
        if arr.dtype.kind == "u" and int(arr.max()) > np.iinfo(np.int64).max:
            raise SkipError(f"sample id {int(arr.max())} is not an id of this data")
        arr = arr.astype(np.int64)
        if (arr < 0).any():
            raise SkipError("id -1 marks a row that holds no sample (an epoch-padding or skipped batch's): leave "
                            "it out of ids" if (arr == -1).any() else f"sample id {int(arr.min())} is not an id of "
                            f"this data (ids are 0 or more)")
        try:
            found = self.describe_ids(arr)
        except ValueError as e:
            raise SkipError(str(e)) from None
        groups: dict = {}
        for d in found:
            groups.setdefault((d["stream"], d["shard"]), []).append(d["row"])
        rows = [{"stream": k, "shard": int(n), "rows": as_ranges(v)} for (k, n), v in sorted(groups.items())]
        return {"rows": rows, "ids": int(len(np.unique(arr)))}

    def _skip_where(self, where) -> dict:
        """``where``'s terms checked against this run's streams, tasks, corpora and shards."""
        from babelfeed.iterators.skips import TERMS, SkipError, name_list, range_arg, where_terms

        where_terms(where, TERMS, "a translation run")
        sources = self.planner.sources
        known = {"stream": [s.name for s in sources.streams], "task": list(sources.tasks),
                 "corpus": sorted({s.key for s in sources.streams})}
        out: dict = {}
        for term in ("stream", "task", "corpus"):
            if term in where:
                out[term] = name_list(where[term], term, known[term])
        if "shard" in where:
            v = where["shard"]
            shards = [v] if isinstance(v, (int, np.integer)) else list(v) if isinstance(v, (list, tuple, range)) \
                else None
            have = sorted({int(c.shard) for c in sources.components})
            if not shards or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in shards):
                raise SkipError(f"where['shard'] takes a shard number or a list of them, got {v!r}")
            missing = [int(x) for x in shards if int(x) not in have]
            if missing:
                raise SkipError(f"where['shard']: shard {missing[0]} is not a shard of this run (it has {have[:20]})")
            out["shard"] = sorted({int(x) for x in shards})

        def matched(terms):
            trial = Skips([{"event": "skip", "step": 0, "epoch": 1, "batch": 0, "reason": "", "where": terms}])
            return [c for c, x in zip(sources.components, trial._rules(sources, 1)[0]) if x]

        picked = matched(out)
        if not picked:  # (each term names something of the run, but no shard has them all)
            others = {k: v for k, v in out.items() if k != "shard"}
            have = sorted({int(c.shard) for c in matched(others)}) if others else []
            raise SkipError(f"where={where!r}: no shard of this run matches every term"
                            + (f" (what the other terms name has shard(s) {have[:20]})" if have else "")
                            + "; it would skip nothing")
        if "rows" in where:
            out["rows"] = range_arg(where["rows"], "where['rows']")
            longest = max(len(c) for c in picked)
            if out["rows"][0] >= longest:
                raise SkipError(f"where['rows'] {out['rows'][0]}-{out['rows'][1] - 1}: the shards it names hold at "
                                f"most {longest:,} records (rows 0 to {longest - 1:,}); it would skip nothing")
        return out

    def batch_for_step(self, step: int, state: dict | None = None, rank: int | None = None) -> dict:
        """The batch rank ``rank`` (default: this iterator's) received at training step ``step`` (1-based, since
        training began), rebuilt exactly, leaf for leaf, without serving the steps before it. ``state``: the
        run's latest state (default: this iterator's own), whose history answers any step: across mixture edits,
        weight changes, skips and resumes on other world sizes (``rank`` counts the ranks of the world size that
        took the step). With ``split="rows"``, the rank's block of that many equal row blocks (the JAX adapter
        may hand a process other blocks: ``take_row_blocks``). This iterator's position is left as it was."""
        from babelfeed.iterators.ledger import check_trace_state
        from babelfeed.iterators.replay import step_batch

        if state is None:
            state = self.get_state()
        else:
            from babelfeed.iterators.history import upgrade
            from babelfeed.iterators.state import find_state

            state = upgrade(find_state(state, "state"))
            if not state.get("version"):  # a bare loader position: the run's state there
                from babelfeed.iterators.state import resolve

                state = resolve(state, self)
            check_trace_state(self, state)
        return step_batch(self, step, state, rank)

    def trace(self, step: int, state: dict | None = None) -> list:
        """The samples of training step ``step`` (1-based, since training began) on every rank: where each came
        from (stream, task, corpus, shard, row) and its lengths. ``state``: the run's latest state (default: this
        iterator's own), whose history answers any step of the run, before or after edits, weight changes and
        resumes on other world sizes. This iterator's position is left as it was. See ``babelfeed.ledger.trace``."""
        from babelfeed.iterators.ledger import trace

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
            raise ValueError(f"epoch {epoch}, global batch {consumed} lies before this run's mixture edit (epoch "
                             f"{part.epoch}, global batch {part.batch}), which this iterator plans from")
        self.epoch, self._base, self.step = int(epoch), int(consumed), 0
        self.total_steps = int(total_steps)
        self._hint, self._ra_hint = (0, 0), {}

    # ----------------------------------------------------------------------------------------- state
    def fingerprint(self) -> str:
        return self.planner.fingerprint()

    def fingerprints(self) -> tuple:
        return (self.planner.fingerprint(), self.planner.fingerprint(legacy=True))

    def identity(self) -> dict:
        return self.planner.identity()

    def get_state(self) -> dict:
        """A small JSON-serialisable dict; the same on every rank at the same step."""
        c = self.consumed
        epoch = self.epoch
        if self.planner.locate(epoch, c, self._hint) is None and c > 0:
            epoch, c = epoch + 1, 0  # finished epoch: resume at the start of the next
        from babelfeed.iterators.history import compose
        from babelfeed.iterators.ledger import as_state, skipped_state

        planner = self.planner
        stream = planner.sampler.streams
        tasks = planner.sources.tasks
        # the run's history: world sizes, set_weights' changes (at which global batch, which task weights), how
        # schedule updates were counted ([first global batch, update, per]) and the mixture edits
        history = compose(self.steps_out(), [[at, dict(zip(tasks, w.tolist()))] for at, w in planner.weight_changes],
                          [[b, u, p] for b, u, p in planner.update_segments] if stream and planner.changing_schedule
                          else [], self.edits, self.skips.events, self.splits_out())
        state = {"version": STATE_VERSION, "kind": self.kind, "name": self.name, "epoch": epoch, "consumed": c,
                 "total_steps": self.total_steps, "fingerprint": planner.fingerprint(), "history": history,
                 "identity": copy.deepcopy(planner.identity())}  # (a copy: the state is the caller's)
        if stream:  # where every stream stood when this epoch began
            positions, batches = planner.epoch_start(epoch)
            state["stream"] = {"positions": positions.tolist(), "batches": int(batches)}
        state["ledger"] = as_state(self.ledger_start(epoch), planner.keys)  # consumed before this epoch
        if self.skips:  # what the skips dropped before this epoch
            state["skipped"] = skipped_state(self.skipped_start(epoch), planner.keys, self._skipped_other)
        if stream:
            state["stream"]["keys"] = list(self.planner.keys)  # positions by name: an edit maps them
            served = planner.served_by_key(epoch)
            if served:  # rows an edit left served ahead of their streams' positions (plan.parts)
                from babelfeed.plan.parts import encode

                state["served"] = {k: encode(v) for k, v in served.items()}
        part = planner.part
        if part is not None and part.epoch == epoch:  # an edited epoch: where its part began (plan.parts)
            state["part"] = part.to_state()
        if self.config_snapshot is not None:  # what an edit compares and, from the edits, every earlier config
            from babelfeed.iterators.edits import stream_identities

            state["config"] = self.config_snapshot
            state["data"] = stream_identities(self.planner)  # per stream: what its sequence reads
        if self.dormant:
            state["dormant"] = copy.deepcopy(self.dormant)
        return state

    STATE_FIELDS = ("stream", "ledger", "config", "dormant", "history", "skipped", "data", "part", "served")

    def _load_skipped(self, saved, epoch: int) -> None:
        """The state's ``skipped`` counts (what the skips dropped before ``epoch``), per stream; counted from the
        plans of earlier epochs where the state has none."""
        from babelfeed.iterators.ledger import skipped_from_state

        zeros = np.zeros((3, len(self.planner.keys)), np.int64)
        self._skipped_other = {}
        if saved is None:
            self._skipped_start = {1: zeros}
            return
        totals, self._skipped_other = skipped_from_state(saved, self.planner.keys)
        self._skipped_start = {epoch: totals}

    def steps_out(self) -> list:
        """The state's ``steps``: how steps were counted (a segment per world size the run was resumed on)."""
        return [list(x[:4]) for x in self.step_log] or [[0, 1, 0, self.world_size]]

    def splits_out(self) -> list:
        """Per segment of :meth:`steps_out`, how its ranks split the batches."""
        return [x[4] for x in self.step_log] or [self.split]

    def _log_steps(self, steps, total: int, epoch: int, consumed: int, splits=None) -> None:
        """The step segments after a resume at step ``total`` (``epoch``, ``consumed``) on this world size and
        split: a new segment where either differs from the last one's."""
        splits = list(splits or []) + [None] * (len(steps or []) - len(splits or []))
        log = [list(x[:4]) + [sp] for x, sp in zip(steps, splits)] if steps else []

        def mine(seg) -> bool:  # (a segment whose split an earlier babelfeed did not record: this one's)
            return seg[3] == self.world_size and seg[4] in (None, self.split)

        while log and log[-1][0] == total and len(log) > 1:  # a world size that took no step: no segment
            log.pop()
        if log and log[-1][0] == total and not mine(log[-1]):
            log.pop()  # (the run's first segment, without a step yet)
        if log and mine(log[-1]):
            log[-1][4] = self.split
        else:
            log.append([int(total), int(epoch), int(consumed), int(self.world_size), self.split])
        self.step_log = log

    def _check_dormant(self, dormant) -> None:
        from babelfeed.iterators.ledger import FIELDS

        if not isinstance(dormant, dict):
            raise ValueError(f"iterator state field 'dormant' must map removed streams to their position and counts, "
                             f"got {str(dormant)[:200]}")
        for k, v in dormant.items():
            ok = (isinstance(k, str) and isinstance(v, dict) and set(FIELDS) <= set(v)
                  and set(v) <= {"position", "rows", "served", *FIELDS}
                  and all(type(x) is int and x >= 0 for f, x in v.items() if f != "served")
                  and isinstance(v.get("served", ""), str))
            if not ok:
                raise ValueError(f"iterator state field 'dormant' holds {k!r}: {str(v)[:200]}; a removed stream is "
                                 f"{{{', '.join(repr(f) for f in FIELDS)}, 'position'?, 'rows'?: integers >= 0, "
                                 f"'served'?: positions}}")

    def _check_extra(self, state: dict):
        """The optional fields of a state: well formed, or an error naming the field. Returns the history's
        views (``babelfeed.iterators.history``)."""
        from babelfeed.iterators.history import HistoryError, Views, check

        if "dormant" in state:
            self._check_dormant(state["dormant"])
        if "history" not in state:
            return Views()
        total = int(state["total_steps"])
        views = check(state["history"], total)
        # nothing in the history lies beyond the state's own position (an edited event would change the batches)
        at = (state.get("epoch"), state.get("consumed"))
        if all(type(x) is int for x in at):
            late = [s for s in views.steps if (s[1], s[2]) > at]
            if late:
                raise HistoryError(f"iterator state field 'history': a 'ranks' event counts from epoch {late[0][1]}, "
                                   f"global batch {late[0][2]}, past the state's own position (epoch {at[0]}, "
                                   f"consumed {at[1]})")
            late = [e for e in views.edits if e.get("saved_at_step", e["step"]) > total
                    or (e["epoch"], e.get("batch", 0)) > at]
            if late:
                raise HistoryError(f"iterator state field 'history': an 'edit' event made at step "
                                   f"{late[0].get('saved_at_step', late[0]['step'])} (epoch {late[0]['epoch']}) lies "
                                   f"past the state's own position (step {total}, epoch {at[0]})")
            early = [e for e in views.skips if "steps" in e and any((b[0], b[1]) < (e["epoch"], e["batch"])
                                                                   for b in e["batches"])]
            if early:
                raise HistoryError(f"iterator state field 'history': the skip of steps {early[0]['steps']} names "
                                   f"global batches {early[0]['batches'][:3]} before its own position (epoch "
                                   f"{early[0]['epoch']}, batch {early[0]['batch']}): batches already served")
            late = [e for e in views.skips if "epoch" not in e or (e["epoch"], e["batch"]) > at]
            if late:
                raise HistoryError(f"iterator state field 'history': a skip made at "
                                   f"{'an LM run' if 'sample' in late[0] else (late[0]['epoch'], late[0]['batch'])} "
                                   f"(epoch, global batch) lies past the state's own position {at}")
            stream = state.get("stream")
            if isinstance(stream, dict) and type(stream.get("batches")) is int:
                part = state.get("part")
                first = part.get("batch", 0) if isinstance(part, dict) and type(part.get("batch")) is int else 0
                now = stream["batches"] + at[1] - first
                late = [w for w in views.weights if w[0] > now]
                if late:
                    raise HistoryError(f"iterator state field 'history': a 'weights' event takes effect at global "
                                       f"batch {late[0][0]}, past the state's own position (global batch {now})")
        return views

    def set_state(self, state: dict, mixture_change: str = "refuse") -> None:
        """Continue after ``state`` (from ``get_state()``). A state of another config: ``mixture_change``
        (``protocol.MIXTURE_CHANGES``) says what to do. ``"allow"``: the config was edited (weights, temperature,
        corpora or tasks added or removed, batching...): every stream goes on from its position from the next
        step, the rows the planning window in progress had not served back in their streams
        (``babelfeed.iterators.edits``); a change to a kept stream's data, the seed, the sampler or the shard
        scheme is refused. ``"keep_position"``: this config's plan from the state's epoch and global batch, said
        out loud (samples may repeat or be skipped)."""
        from babelfeed.iterators.protocol import check_mixture_change, say_kept_position

        check_mixture_change(mixture_change)
        strict = mixture_change != "keep_position"
        state = self._state_in(state)
        stream = self.planner.sampler.streams
        self._refuse_a_stream_state(state, "resume with the run's config")
        if (mixture_change == "allow" and isinstance(state, dict)
                and state.get("fingerprint") not in self.fingerprints()):
            return self._resume_edited(state)
        self._check_state(state, strict, {"epoch": 1, "consumed": 0, "total_steps": 0},
                          optional=self.STATE_FIELDS)
        history = self._check_extra(state)
        if stream and "stream" in state:
            self._check_stream(state["stream"], self.planner.keys)
        elif stream and strict:
            raise ValueError("iterator state lacks 'stream' (where each stream stood when the epoch began), which "
                             "get_state() writes for mixing.sampler='stream'")
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        if epoch >= 1 << 31:
            raise ValueError(f"iterator state field 'epoch' must be below 2**31 (epochs seed the shuffles), got {epoch}")
        self._check_epoch_reached(state, epoch)
        changes = self._check_weights(history.weights)
        if changes or self.planner.weight_changes:  # plans made with other weights are not this state's
            self.planner.forget_plans()
            self.planner.weight_changes = []
            for at, w in changes:
                self.planner.set_weights(at, w)
        planner = self.planner
        if stream and planner.changing_schedule:
            saved = [tuple(x) for x in history.updates] or \
                [(0, 0.0, planner.opts.batches_per_update)]  # an older state: its fingerprint held the count
            # (two counts from one window mark: an earlier babelfeed wrote one per resume; the last one counts)
            saved = [x for i, x in enumerate(saved) if i + 1 == len(saved) or saved[i + 1][0] != x[0]]
            if [tuple(x) for x in planner.update_segments] != saved:  # plans counted otherwise are not this state's
                planner.forget_plans()
                planner.update_segments = [(int(b), float(u), int(p)) for b, u, p in saved]
        part = self._check_part(state, epoch, consumed)
        if part is not None:  # an edited epoch: it goes on from where the edit began it (plan.parts)
            planner.begin(part)
        elif stream and "stream" in state:
            self.planner.set_epoch_start(epoch, state["stream"]["positions"], state["stream"]["batches"])
        else:
            planner.part = None
        if stream:
            planner.served_ahead = self._check_served(state.get("served", {}))
        if stream and planner.changing_schedule and planner.update_segments[-1][2] != planner.opts.batches_per_update:
            # resumed on another world size or accumulation: from the next window on, an update is this run's
            planner.count_updates_from_here(planner.since_start(epoch, consumed), planner.opts.batches_per_update)
        if consumed > planner.first_batch(epoch) and self.planner.locate(epoch, consumed - 1) is None:
            raise ValueError(f"iterator state consumed={consumed} is past the end of epoch {epoch}, which has "
                             f"{self.planner.num_batches(epoch)} global batches")
        if "ledger" in state:
            from babelfeed.iterators.ledger import from_state

            self._ledger_start = {epoch: from_state(state["ledger"], self.planner.keys)}
        else:  # a state without a ledger (an older babelfeed): counted from every earlier epoch's plan
            self._ledger_start = {1: np.zeros((3, len(self.planner.keys)), np.int64)}
        self.dormant = copy.deepcopy(state.get("dormant", {}))
        self.edits = history.edits
        self.skips = Skips(history.skips)
        self._fillers = {}
        self._load_skipped(state.get("skipped"), epoch)
        self.epoch = epoch
        self._base = consumed
        self.step = 0
        self._hint = (0, 0)
        self._ra_hint = {}
        self.total_steps = int(state["total_steps"])
        self._log_steps(history.steps, self.total_steps, epoch, consumed, history.splits)
        if not strict:
            say_kept_position(self, state)

    def _check_part(self, state: dict, epoch: int, consumed: int):
        """The state's ``part`` (an edited epoch: where the edit began it), checked against its position and this
        config's sampler; None where it has none."""
        if "part" not in state:
            return None
        from babelfeed.plan.parts import Part

        part = Part.from_state(state["part"])
        if part.epoch != epoch or part.batch > consumed:
            raise ValueError(f"iterator state field 'part' begins at epoch {part.epoch}, global batch {part.batch}; "
                             f"the state stands at epoch {epoch}, global batch {consumed}: a part holds the state's "
                             f"own epoch from before its position (edited or damaged)")
        if bool(part.base) == bool(self.planner.sampler.streams):
            raise ValueError(f"iterator state field 'part' was written by a run with "
                             f"{'another sampler than' if part.base else ''} mixing.sampler="
                             f"{self.planner.opts.sampler!r}: resume with the run's config")
        return part

    def _check_served(self, served) -> dict:
        """The state's ``served`` (rows an edit left served ahead of their streams), by stream index."""
        from babelfeed.plan.parts import decode

        index = {k: i for i, k in enumerate(self.planner.keys)}
        if not isinstance(served, dict):
            raise ValueError(f"iterator state field 'served' must map streams to served positions, got "
                             f"{str(served)[:200]}")
        out = {}
        for k, v in served.items():
            if k not in index or not isinstance(v, str):
                raise ValueError(f"iterator state field 'served' names {k!r}, not a stream of this config, or holds "
                                 f"no positions")
            try:
                out[index[k]] = decode(v)
            except ValueError:
                raise ValueError(f"iterator state field served[{k!r}] is not a set of positions (edited or "
                                 f"damaged)") from None
        return out

    def _refuse_a_stream_state(self, state, then: str) -> None:
        """Refuse a state of the stream sampler (where every stream stands) when this config's is another."""
        if not self.planner.sampler.streams and isinstance(state, dict) and {"stream", "served"} & set(state):
            raise ValueError(f"this state was saved with mixing.sampler='stream' (it holds where every stream stands); "
                             f"this config's sampler is {self.planner.opts.sampler!r}: {then}")

    @staticmethod
    def _check_epoch_reached(state: dict, epoch: int) -> None:
        """Refuse an epoch the state's own counts say the run never reached: every epoch before it took at least
        one step and one sample (a hand-edited ``epoch``: it would be accepted, or, without a ledger, counted for
        hours)."""
        total = int(state["total_steps"])
        if total < epoch - 1:
            raise ValueError(f"iterator state says epoch {epoch} after {total} training steps, but every epoch takes "
                             f"at least one step: the state was edited or is damaged (total_steps, epoch)")
        ledger = state.get("ledger")
        if isinstance(ledger, dict) and isinstance(ledger.get("samples"), dict):
            served = sum(v for v in ledger["samples"].values() if isinstance(v, int) and not isinstance(v, bool))
            if served < epoch - 1:
                raise ValueError(f"iterator state says epoch {epoch}, but its ledger counts {served} samples served "
                                 f"before it, and every epoch serves at least one: the state was edited or is damaged")

    def _resume_edited(self, state: dict) -> None:
        """set_state with mixture_change="allow" for a state of another config (``babelfeed.iterators.edits``):
        the saved run is rebuilt from the config the state carries, and this run goes on from where it stood."""
        import ml_collections

        from babelfeed.iterators.edits import check_data, check_editable
        from babelfeed.iterators.protocol import builder

        self._check_state(state, False, {"epoch": 1, "consumed": 0, "total_steps": 0}, optional=self.STATE_FIELDS)
        self._check_extra(state)
        self._check_epoch_reached(state, int(state["epoch"]))
        snap = state.get("config")
        if not isinstance(snap, dict):
            raise ValueError("this state carries no config of its run (saved by an older babelfeed, or by an "
                             "iterator not built from a config): resume with the config it was saved with, then "
                             "edit at a later state")
        data = state.get("data") if "data" in state else (state.get("stream") or {}).get("data")
        check_data(data or {}, snap, self.planner)
        check_editable(snap, self.config_snapshot or {}, self.planner)  # (before the saved run is rebuilt)
        old_cfg = ml_collections.ConfigDict(snap)
        if self.config_snapshot is not None:
            old_cfg.data.path = self.config_snapshot["data"]["path"]  # the data as this run finds it
        old = builder("translation")(old_cfg, rank=self.rank, world_size=self.world_size, split=self.split)
        try:
            old.set_state(state)  # the saved config reproduces the saved run
        except ValueError as e:
            raise ValueError(f"the config this state was saved with does not reproduce its run on the data at "
                             f"{old_cfg.data.path} (a stream the edit removed reads other data now?): {e}") from None
        self.continue_from(old)

    def take_edit(self, old):
        """:meth:`edit`'s second half: go on with this iterator's config from ``old`` (the run, in this process),
        once the edit is checked as a resume checks it."""
        from babelfeed.iterators.edits import check_data, check_editable, stream_identities

        check_data(stream_identities(old.planner), old.config_snapshot or {}, self.planner)
        check_editable(old.config_snapshot or {}, self.config_snapshot or {}, self.planner)
        return self.continue_from(old)

    def continue_from(self, old, quiet: bool = False) -> "EditReport":
        """Go on with this iterator's config where ``old`` (an iterator of the run so far, another config of the
        same data) stands: from its next step, every stream from its position, the rows of the planning window in
        progress that were not served back in their streams (``babelfeed.plan.parts``). The ledger, skips, world
        sizes and history go on; the edit is recorded in the history and said (an ``EditReport``, also kept as
        ``last_edit``; ``quiet``: not said, as when trace replays a run's edits)."""
        from babelfeed.iterators.edits import EditReport, config_changes, map_totals
        from babelfeed.iterators.ledger import FIELDS

        planner, P = self.planner, old.planner
        epoch, consumed = old.epoch, old.consumed
        if consumed and P.locate(epoch, consumed) is None:  # (the epoch is over: the edit begins the next one)
            epoch, consumed = epoch + 1, 0
        history = old.skips.events
        pending = [b for e in history if "steps" in e for b in e["batches"] if b[0] > epoch]
        if pending:
            from babelfeed.iterators.skips import SkipError

            raise SkipError(f"this run skips global batches {pending[0][1]}..{pending[0][2] - 1} of epoch "
                            f"{pending[0][0]}, an epoch it has not reached yet, and an edit changes how many batches "
                            f"the epochs before it hold (other steps): resume with its own config, or skip those "
                            f"samples by id (it.skip(ids=...), the ids trace names) after the edit")
        before = EditReport.shares_of(old)
        part = P.handoff(old.epoch, old.consumed)
        keys, old_keys = list(planner.keys), list(P.keys)
        for k, kept in old.dormant.items():  # streams an earlier edit removed, added back: where they stood
            if k in keys and k not in part.positions and "position" in kept and planner.sampler.streams:
                part.positions[k] = int(kept["position"])
                if kept.get("served"):
                    from babelfeed.plan.parts import decode

                    part.served[k] = decode(kept["served"])
        segs = list(P.update_segments)
        at = part.batches if planner.sampler.streams else 0
        if segs[-1][2] != planner.opts.batches_per_update:
            if segs[-1][0] >= at:
                segs.pop()
            segs.append((int(at), float(P.update_at(at)), int(planner.opts.batches_per_update)))
        planner.weight_changes = []  # the edited config's weights rule from here
        planner.update_segments = segs or [(0, 0.0, planner.opts.batches_per_update)]
        planner.begin(part)
        first = (part.epoch, part.batch)
        # the ledger where the edit takes effect, in this config's streams; a removed stream's counts (and, stream
        # sampler, its position and served rows) stay in the state's dormant streams
        _, totals, _, skipped = old.ledger_totals(old.epoch, old.consumed)
        counts = {k: {f: int(totals[i, n]) for i, f in enumerate(FIELDS)} for n, k in enumerate(old_keys)}
        rows = {}
        for c in P.sources.components:
            rows[c.key] = rows.get(c.key, 0) + len(c)
        for name, kept in old.dormant.items():
            counts.setdefault(name, {f: int(kept[f]) for f in FIELDS})
        self._ledger_start = {first[0]: map_totals(np.zeros((3, 0), np.int64), [], keys, counts)}
        dormant = {}
        for k in set(old_keys) | set(old.dormant):
            if k in keys:
                continue
            was = old.dormant.get(k, {})
            entry = {**{f: counts[k][f] for f in FIELDS}, "rows": int(rows.get(k, was.get("rows", 0)))}
            if planner.sampler.streams:
                entry["position"] = int(part.positions.get(k, was.get("position", 0)))
                served = part.served.get(k)
                if served is not None and len(served):
                    from babelfeed.plan.parts import encode

                    entry["served"] = encode(served)
                elif was.get("served"):
                    entry["served"] = was["served"]
            dormant[k] = entry
        self.dormant = dormant
        others = {k: list(v) for k, v in old._skipped_other.items()}
        if skipped is not None:
            for n, k in enumerate(old_keys):
                if k not in keys:
                    others[k] = [int(x) for x in skipped[:, n]]
            start = map_totals(skipped, old_keys, keys)
            for k in list(others):
                if k in keys:  # (a stream added back: its counts go on)
                    start[:, keys.index(k)] += others.pop(k)
        else:
            start = np.zeros((3, len(keys)), np.int64)
        self._skipped_start, self._skipped_other = {first[0]: start}, others
        self.skips = Skips(old.skips.events)
        self._fillers = {}
        self.total_steps = int(old.total_steps)
        steps = [list(x[:4]) for x in old.step_log] or [[0, 1, 0, old.world_size]]
        self._log_steps(steps, self.total_steps, *first, splits=[x[4] for x in old.step_log] or [old.split])
        changes = config_changes(old.config_snapshot or {}, self.config_snapshot or {})
        event = {"step": int(self.total_steps), "epoch": int(first[0]), "batch": int(first[1]),
                 "changes": changes, "saved": {"weights": [[b, dict(zip(P.sources.tasks, w.tolist()))]
                                                           for b, w in P.weight_changes],
                                               "updates": [list(u) for u in P.update_segments]
                                               if P.sampler.streams and P.changing_schedule else []}}
        self.edits = list(old.edits) + [event]
        self.epoch, self._base, self.step = first[0], first[1], 0
        self._hint, self._ra_hint = (0, 0), {}
        self.last_edit = EditReport.made(self, before, changes, part.returned)
        if not quiet:
            self.last_edit.say()
        return self.last_edit

    def _check_weights(self, changes) -> list:
        """The weight changes of a state's history (set_weights'): ``[[global batch, {task: weight}], ...]`` in
        order, for this config's tasks."""
        tasks = self.planner.sources.tasks
        out = []
        if not isinstance(changes, list):
            raise ValueError(f"weight changes are a list of [global batch, {{task: weight}}], got {str(changes)[:200]}")
        for change in changes:
            ok = (isinstance(change, list) and len(change) == 2 and isinstance(change[0], int)
                  and not isinstance(change[0], bool) and change[0] >= 0 and isinstance(change[1], dict)
                  and sorted(change[1]) == sorted(tasks)
                  and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                          for v in change[1].values()))
            if not ok:
                raise ValueError(f"iterator state field 'history' holds the weight change {str(change)[:200]}: each "
                                 f"must give a weight >= 0 at a global batch >= 0 for the tasks {tasks}")
            out.append((change[0], [float(change[1][t]) for t in tasks]))
        return out

    def _check_stream(self, stream, keys=None) -> None:
        if isinstance(stream, dict) and "keys" in stream and keys is not None and stream["keys"] != list(keys):
            raise ValueError(f"iterator state field stream['keys'] names the streams {str(stream['keys'])[:200]}, "
                             f"this config's are {str(list(keys))[:200]}: an edited mixture resumes with "
                             f"set_state(state, mixture_change='allow')")
        ok = (isinstance(stream, dict) and set(stream) - {"keys"} == {"positions", "batches"}
              and isinstance(stream["positions"], list) and isinstance(stream["batches"], int)
              and not isinstance(stream["batches"], bool) and stream["batches"] >= 0
              and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in stream["positions"]))
        if not ok:
            raise ValueError(f"iterator state field 'stream' must be {{'positions': [integers >= 0], 'batches': "
                             f"integer >= 0}}, got {stream!r}"[:300])
