"""Plan an epoch on integers, then gather each batch once.

    epoch e ──▶ directions (shard (e-1) % k of each) ──▶ counts c_i (temperature, virtual size)
            ──▶ windows: window w takes a proportional slice of every direction's pseudorandom sequence
            ──▶ per window: filter too-long, order by (max(src,tgt), src), token-budget batches,
                shuffle batches in blocks of similar cost
            ──▶ global batch g of the epoch is served by rank g % world_size
            ──▶ gather + collate (collate.py)

Every random choice is a pure function of (seed, epoch, window). The iterator state is a handful of
integers: the epoch and the number of global batches consumed, so a run resumes bit-identically in a fresh
process, and on a different world size from the same global position.

When an epoch's batch count is not a multiple of the world size, the last step is completed with fully
masked batches (every ``weight`` 0, ``ntokens`` 0): every rank takes the same number of steps, no rank waits in
a collective, and no sample is dropped or carried into a different epoch (which would make an epoch's content
depend on the world size).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field

import numpy as np

from .batching import batch_sorted, fairseq_batch_by_size, fairseq_ordered_indices, length_order
from .collate import CollateOptions, collate_packed, collate_pairs, fill_at
from .transforms import NoiseContext, Ragged, apply as apply_noise
from .packing import pack_pairs, ragged_arange
from .mixing import (SAMPLERS, StratifiedDraw, StreamDraw, fairseq_draw, sampling_probabilities, stratified_counts,
                     task_probabilities, virtual_size, weight_probabilities)
from .sources import Direction, SourceSet
from .subword import RaggedRecords, SampledText

STATE_VERSION = 1
METHODS = ("temperature", "uniform", "weights")


@dataclass(frozen=True)
class PlanOptions:
    seed: int = 1
    sampler: str = "stratified"  # stratified | fairseq | concat
    method: str = "temperature"  # temperature | uniform | weights
    temperature: float = 1.0
    weights: tuple = ()  # ((key, weight), ...) for method="weights"
    virtual_size: str | int = "fairseq"  # "fairseq" | "sum" | an int
    max_scale_up: float = 1.5
    probabilities_from: str = "total"  # sizes over all shards ("total", fairseq) or the epoch's shard ("shard")
    fairseq_sampling_seed: int = 2  # fairseq's multilingual sampler ignores --seed and uses 2
    max_tokens: int = 4096
    max_sentences: int = 0  # 0: no limit
    multiple: int = 8
    window: int = 1_000_000  # samples planned at once; 0: the whole epoch (a global sort)
    max_source_positions: int = 1024
    max_target_positions: int = 1024
    on_too_long: str = "skip"  # skip (count and report) | raise
    balance_block: int = 16  # batches of similar cost shuffled as one block
    shuffle: bool = True  # False: validation order (deterministic, by length)
    shapes: tuple = ()  # static shapes ((B, L_src, L_tgt), ...) or ((B, L), ...); () = dynamic batches
    pack_shape: tuple = ()  # (L_src, L_tgt): pack pairs side by side into rows of this shape
    compat: str = "none"  # "fairseq": reproduce fairseq's multilingual epoch batch for batch
    fairseq_drop_last: bool = False  # fairseq main (after d871f616) drops a last batch that misses the multiple
    schedule: object = None  # a MixingSchedule of per-task weights (sources.tasks order), or None
    batches_per_update: int = 1  # global batches per optimizer update (ranks x accumulation with split="batches")

    def validate(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"mixing.sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.method not in METHODS:
            raise ValueError(f"mixing.method must be one of {METHODS}, got {self.method!r}")
        if not self.temperature > 0:
            raise ValueError(f"mixing.temperature must be > 0, got {self.temperature}")
        if self.max_tokens <= 0:
            raise ValueError(f"batching.max_tokens must be > 0, got {self.max_tokens}")
        if self.max_sentences < 0 or self.multiple < 1 or self.window < 0 or self.balance_block < 1:
            raise ValueError("batching.max_sentences >= 0, required_batch_size_multiple >= 1, window >= 0 and "
                             f"balance_block >= 1 are required, got {self.max_sentences}, {self.multiple}, "
                             f"{self.window}, {self.balance_block}")
        longest = max(self.max_source_positions, self.max_target_positions)
        if longest > self.max_tokens:
            raise ValueError(f"batching.max_tokens={self.max_tokens} is smaller than the longest allowed sample "
                             f"({longest} tokens): lower max_source/target_positions or raise max_tokens")
        if self.on_too_long not in ("skip", "raise"):
            raise ValueError(f"filter.on_too_long must be 'skip' or 'raise', got {self.on_too_long!r}")
        if self.compat not in ("none", "fairseq"):
            raise ValueError(f"compat must be 'none' or 'fairseq', got {self.compat!r}")
        if self.pack_shape:
            if len(self.pack_shape) != 2 or min(self.pack_shape) < 1 or max(self.pack_shape) > self.max_tokens:
                raise ValueError(f"batching.pack must be 'L_srcxL_tgt' within max_tokens, got {self.pack_shape}")
            if self.shapes or self.compat == "fairseq":
                raise ValueError("batching.pack cannot be combined with static shapes or compat='fairseq'")
            if self.max_source_positions > self.pack_shape[0] or self.max_target_positions > self.pack_shape[1]:
                raise ValueError(f"filter.max_source/target_positions ({self.max_source_positions}, "
                                 f"{self.max_target_positions}) must fit the packed row {tuple(self.pack_shape)}")
        if self.compat == "fairseq" and self.shapes:
            raise ValueError("static shapes cannot be combined with compat='fairseq' (fairseq has no such batches)")
        for shape in self.shapes:
            if len(shape) < 2 or shape[0] < 1 or shape[0] * max(shape[1:]) > self.max_tokens:
                raise ValueError(f"shape {tuple(shape)} must be (batch, length...) within max_tokens={self.max_tokens}")
        if self.compat == "fairseq" and self.sampler not in ("fairseq", "concat"):
            raise ValueError("compat='fairseq' needs mixing.sampler 'fairseq' (resampling) or 'concat' (no resampling)")
        if self.sampler == "stream" and self.compat == "fairseq":
            raise ValueError("compat='fairseq' cannot use mixing.sampler='stream' (fairseq redraws every epoch)")
        if self.schedule is not None and self.schedule.boundaries and self.sampler != "stream":
            raise ValueError(f"a mixing schedule that changes during training needs mixing.sampler='stream' (or "
                             f"'auto'), got {self.sampler!r}")
        if self.batches_per_update < 1:
            raise ValueError(f"batches per optimizer update must be >= 1, got {self.batches_per_update}")
        if self.probabilities_from not in ("total", "shard"):
            raise ValueError(f"mixing.probabilities_from must be 'total' or 'shard', got {self.probabilities_from!r}")
        if not (self.virtual_size in ("fairseq", "sum") or (isinstance(self.virtual_size, int) and self.virtual_size > 0)):
            raise ValueError(f"mixing.virtual_size must be 'fairseq', 'sum' or a positive int, got {self.virtual_size!r}")


@dataclass
class EpochSetup:
    epoch: int
    directions: list[Direction]
    probs: np.ndarray
    counts: np.ndarray  # samples per direction this epoch (before filtering)
    draws: list  # per direction: StratifiedDraw, or an index array (fairseq), or None (concat / in order)
    num_windows: int  # stream sampler: -1 until the epoch's last window is planned
    window_batches: dict = field(default_factory=dict)  # window -> number of batches, once planned
    samples: int = 0  # stream sampler: samples in the epoch
    stream: dict = field(default_factory=dict)  # stream sampler: window -> StreamMark at its start
    expected: np.ndarray | None = None  # stream sampler: per-stream counts at the epoch's starting weights

    @property
    def total(self) -> int:
        return int(self.counts.sum())


@dataclass(frozen=True)
class StreamMark:
    """Where the stream sampler stands at the start of a window: sample offset in the epoch, every stream's
    position (samples read since training began), global batches before it (since training began), and the
    optimizer update whose weights the window uses."""

    sample: int
    positions: np.ndarray
    batches: int
    update: float


@dataclass
class Window:
    epoch: int
    index: int
    direction: np.ndarray  # per sample, in plan (length) order
    rows: np.ndarray
    src_len: np.ndarray
    tgt_len: np.ndarray
    ends: np.ndarray  # batch b = [ends[b-1], ends[b]) of the plan order
    order: np.ndarray  # served position j -> batch b
    shape: np.ndarray | None = None  # static shapes: the shape of each batch
    masked: np.ndarray | None = None  # static shapes: rows added to fill each batch (weight 0)
    packed: dict | None = None  # packing: per sample "row" (in its batch), "src_offset", "tgt_offset"

    def __len__(self) -> int:
        return len(self.order)

    def batch(self, j: int) -> slice:
        b = int(self.order[j])
        return slice(int(self.ends[b - 1]) if b else 0, int(self.ends[b]))

    def batch_shape(self, j: int) -> tuple[int, int]:
        """(shape index, masked rows) of the j-th served batch; (-1, 0) for dynamic batches."""
        if self.shape is None:
            return -1, 0
        b = int(self.order[j])
        return int(self.shape[b]), int(self.masked[b])


def _round_up(n: int, multiple: int) -> int:
    return n if multiple <= 1 or n % multiple == 0 else n + multiple - n % multiple


class EpochPlanner:
    """The integer plan of every epoch: which samples, in which window, in which batch, in which order."""

    def __init__(self, sources: SourceSet, opts: PlanOptions):
        opts.validate()
        self.sources, self.opts = sources, opts
        self._setup: EpochSetup | None = None
        self._window_cache: tuple | None = None
        self._filtered: dict[int, dict[int, np.ndarray]] = {}  # epoch -> window -> too-long per direction
        self._masked: dict[int, dict[int, int]] = {}  # epoch -> window -> rows added to fill static shapes
        self._starts: dict[int, tuple[np.ndarray, int]] = {1: (np.zeros(len(sources.keys), np.int64), 0)}
        if opts.schedule is not None and len(opts.schedule.weights[0]) != len(sources.tasks):
            raise ValueError(f"the mixing schedule has {len(opts.schedule.weights[0])} weights per list but there "
                             f"are {len(sources.tasks)} tasks {sources.tasks}")
        if opts.sampler == "stream" and sources.shards == "cycle" and sources.max_shards > 1:
            raise ValueError("mixing.sampler='stream' reads every shard as one stream per corpus: set "
                             "data.shards='all' (shard cycling is a per-epoch scheme)")
        if opts.method == "weights" and opts.schedule is None:
            given = dict(opts.weights)
            missing = [k for k in sources.keys if k not in given]
            extra = [k for k in given if k not in sources.keys]
            if missing or extra:
                raise ValueError(f"mixing.weights must name exactly the directions used; missing {missing}, "
                                 f"unknown {extra}")

    @property
    def keys(self) -> list[str]:
        return self.sources.keys

    def probabilities(self, directions: list[Direction], update: float = 0.0) -> np.ndarray:
        """Per-direction (stream) sampling probabilities at an optimizer update."""
        o = self.opts
        sizes = [d.total_size if o.probabilities_from == "total" else d.size for d in directions]
        if o.sampler == "concat":
            return np.asarray(sizes, np.float64) / max(sum(sizes), 1)
        if o.schedule is not None:
            return task_probabilities(o.schedule.weights_at(update), self.sources.task_of, sizes, o.temperature)
        if o.method == "uniform":
            return np.full(len(sizes), 1.0 / len(sizes))
        if o.method == "weights":
            w = dict(o.weights)
            return weight_probabilities([w[d.key] for d in directions])
        return sampling_probabilities(sizes, o.temperature)

    def setup(self, epoch: int) -> EpochSetup:
        if self._setup is not None and self._setup.epoch == epoch:
            return self._setup
        o = self.opts
        directions = self.sources.directions(epoch)
        sizes = np.array([d.size for d in directions], dtype=np.int64)
        probs = self.probabilities(directions)
        draws: list = []
        if o.sampler == "stream":
            return self._stream_setup(epoch, directions, sizes)
        if o.sampler == "concat":
            counts = sizes.copy()
            for d in directions:
                shuffled = o.shuffle and d.size and o.compat != "fairseq"  # fairseq: rows in order, then permuted
                draws.append(StratifiedDraw(d.size, d.size, (o.seed, "concat", epoch, d.key)) if shuffled else None)
        else:
            total = self._epoch_total(sizes, probs)
            if o.sampler == "fairseq":
                idx = fairseq_draw(sizes, probs, total, epoch, seed=o.fairseq_sampling_seed)
                counts = np.array([len(i) for i in idx], dtype=np.int64)
                draws = list(idx)
            else:
                counts = stratified_counts(probs, total)
                for d, c in zip(directions, counts):
                    if c and not d.size:
                        raise ValueError(f"{d.key} has no sentences in epoch {epoch} but is sampled")
                    draws.append(StratifiedDraw(d.size, int(c), (o.seed, "mix", epoch, d.key)) if c else None)
        total = int(counts.sum())
        num_windows = 1 if not o.window or total <= o.window or o.compat == "fairseq" else -(-total // o.window)
        self._setup = EpochSetup(epoch, directions, probs, counts, draws, max(num_windows, 1))
        self._window_cache = None
        return self._setup

    def _epoch_total(self, sizes, probs) -> int:
        o = self.opts
        if o.virtual_size == "sum":
            return int(sizes.sum())
        return virtual_size(sizes, probs, o.max_scale_up) if o.virtual_size == "fairseq" else int(o.virtual_size)

    # ------------------------------------------------------------------------------------------- streams
    def _stream_setup(self, epoch: int, directions: list[Direction], sizes: np.ndarray) -> EpochSetup:
        positions, batches = self.epoch_start(epoch)
        update = batches / self.opts.batches_per_update
        probs = self.probabilities(directions, update)
        total = self._epoch_total(sizes, probs)
        draws = [StreamDraw(d.size, (self.opts.seed, "stream", d.key)) for d in directions]
        setup = EpochSetup(epoch, directions, probs, np.zeros(len(directions), np.int64), draws, -1,
                           samples=total, expected=stratified_counts(probs, total))
        setup.stream[0] = StreamMark(0, positions, batches, update)
        self._setup = setup
        self._window_cache = None
        return setup

    def epoch_start(self, epoch: int) -> tuple[np.ndarray, int]:
        """Stream sampler: (every stream's position, global batches since training began) at the start of
        ``epoch``. Known from the previous epoch's plan or a resumed state; otherwise earlier epochs are planned
        (integers only) to find it."""
        if epoch not in self._starts:
            known = max(e for e in self._starts if e < epoch)
            for e in range(known, epoch):
                self.num_batches(e)
        return self._starts[epoch]

    def set_epoch_start(self, epoch: int, positions, batches: int) -> None:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.shape != (len(self.keys),) or (positions < 0).any() or batches < 0:
            raise ValueError(f"a stream state needs {len(self.keys)} non-negative positions, got {positions.tolist()}")
        self._starts[epoch] = (positions, int(batches))
        if self._setup is not None and self._setup.epoch == epoch:
            self._setup = None

    def _stream_window(self, setup: EpochSetup, epoch: int, w: int) -> Window:
        """Window w of a stream epoch: counts from the weights at its first batch's update. With a step
        schedule, a window that would run past a boundary is cut where the boundary falls, and the next window
        starts on the new weights."""
        o = self.opts
        self._plan_marks(setup, w)
        if w not in setup.stream or setup.stream[w].sample >= setup.samples:
            raise IndexError(f"epoch {epoch} has fewer than {w + 1} windows")
        mark = setup.stream[w]
        size = min(o.window or setup.samples, setup.samples - mark.sample)
        win, counts = self._stream_plan(setup, epoch, w, mark, size)
        next_update = (mark.batches + len(win)) / o.batches_per_update
        sched = o.schedule
        if sched is not None and sched.mode == "step" and len(win):
            crossed = [b for b in sched.boundaries if mark.update < b < next_update]
            if crossed and size > 1:
                at = crossed[0] * o.batches_per_update - mark.batches  # batches until the boundary
                size = max(1, size * at // len(win))
                win, counts = self._stream_plan(setup, epoch, w, mark, size)
                next_update = max((mark.batches + len(win)) / o.batches_per_update, crossed[0])
        if w + 1 not in setup.stream:
            setup.counts += counts
            nxt = StreamMark(mark.sample + size, mark.positions + counts, mark.batches + len(win), next_update)
            setup.stream[w + 1] = nxt
            if nxt.sample >= setup.samples:
                setup.num_windows = w + 1
                self._starts[epoch + 1] = (nxt.positions, nxt.batches)
        return win

    def _stream_plan(self, setup, epoch, w, mark: StreamMark, size: int):
        probs = self.probabilities(setup.directions, mark.update)
        counts = stratified_counts(probs, size)
        dirs, rows, spans = [], [], []
        at = 0
        for d, c in enumerate(counts.tolist()):
            if not c:
                continue
            pos = np.arange(mark.positions[d], mark.positions[d] + c, dtype=np.int64)
            try:
                rows.append(setup.draws[d].rows(pos))
            except ValueError:
                raise ValueError(f"{setup.directions[d].key} has no sentences but is sampled") from None
            dirs.append(np.full(c, d, dtype=np.int32))
            spans.append((d, at, at + c))
            at += c
        dirs = np.concatenate(dirs) if dirs else np.zeros(0, np.int32)
        rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        return self._plan_window(setup, epoch, w, dirs, rows, spans), counts

    def stream_mark(self, epoch: int, w: int) -> StreamMark:
        """Stream sampler: the mark at the start of window w (plans earlier windows if needed)."""
        setup = self.setup(epoch)
        self._plan_marks(setup, w)
        return setup.stream[w]

    def _plan_marks(self, setup: EpochSetup, w: int) -> None:
        """Plan the windows before w until its mark exists (or the epoch's last window is planned): each
        window's mark comes from planning the one before it."""
        while w not in setup.stream and setup.num_windows < 0:
            self.window(setup.epoch, max(setup.stream))

    # ------------------------------------------------------------------------------------------- windows
    def _window_slice(self, setup: EpochSetup, w: int) -> tuple[np.ndarray, np.ndarray, list]:
        """The window's samples as (direction, row) arrays, direction by direction, and each direction's span."""
        total = setup.total
        size = self.opts.window if self.opts.window and setup.num_windows > 1 else total
        lo_pos, hi_pos = w * size, min((w + 1) * size, total)
        dirs, rows, spans = [], [], []
        at = 0
        for d, (c, draw) in enumerate(zip(setup.counts.tolist(), setup.draws)):
            if not total or not c:
                continue
            lo, hi = c * lo_pos // total, c * hi_pos // total
            if hi <= lo:
                continue
            pos = np.arange(lo, hi, dtype=np.int64)
            if draw is None:
                r = pos
            elif isinstance(draw, StratifiedDraw):
                r = draw.rows(pos)
            else:
                r = np.asarray(draw[lo:hi], dtype=np.int64)
            dirs.append(np.full(len(r), d, dtype=np.int32))
            rows.append(r)
            spans.append((d, at, at + len(r)))
            at += len(r)
        if not dirs:
            return np.zeros(0, np.int32), np.zeros(0, np.int64), []
        return np.concatenate(dirs), np.concatenate(rows), spans

    def window(self, epoch: int, w: int) -> Window:
        if self._window_cache and self._window_cache[0] == (epoch, w):
            return self._window_cache[1]
        setup = self.setup(epoch)
        if self.opts.sampler == "stream":
            return self._stream_window(setup, epoch, w)
        if not 0 <= w < setup.num_windows:
            raise IndexError(f"epoch {epoch} has {setup.num_windows} windows, not {w + 1}")
        dirs, rows, spans = self._window_slice(setup, w)
        return self._plan_window(setup, epoch, w, dirs, rows, spans)

    def _plan_window(self, setup: EpochSetup, epoch: int, w: int, dirs, rows, spans) -> Window:
        """A window's samples -> lengths, filter, order, batches, served order."""
        o = self.opts
        src_len = np.zeros(len(rows), np.int64)
        tgt_len = np.zeros(len(rows), np.int64)
        for d, a, b in spans:
            direction = setup.directions[d]
            comp_ids, local = direction.locate(rows[a:b])
            if len(direction.components) == 1:
                comp = direction.components[0]
                src_len[a:b] = comp.src_lengths(local)
                if comp.tgt is not None:
                    tgt_len[a:b] = comp.tgt_lengths(local)
                continue
            for cid in np.unique(comp_ids):
                m = np.flatnonzero(comp_ids == cid) + a
                comp = self.sources.components[int(cid)]
                src_len[m] = comp.src_lengths(local[m - a])
                if comp.tgt is not None:
                    tgt_len[m] = comp.tgt_lengths(local[m - a])
        if o.compat == "fairseq":
            return self._fairseq_window(setup, epoch, w, dirs, rows, src_len, tgt_len)
        too_long = (src_len > o.max_source_positions) | (tgt_len > o.max_target_positions)
        filtered = np.bincount(dirs[too_long], minlength=len(setup.directions)).astype(np.int64)
        if too_long.any():
            if o.on_too_long == "raise":
                i = int(np.flatnonzero(too_long)[0])
                d = setup.directions[int(dirs[i])]
                raise ValueError(
                    f"{d.key} row {int(rows[i])}: {int(src_len[i])} source / {int(tgt_len[i])} target tokens, over "
                    f"max_source_positions={o.max_source_positions} / max_target_positions={o.max_target_positions} "
                    f"(filter.on_too_long='raise'; 'skip' drops and counts such samples)")
            keep = ~too_long
            dirs, rows, src_len, tgt_len = dirs[keep], rows[keep], src_len[keep], tgt_len[keep]
        rng = np.random.default_rng([o.seed, epoch, w, 7])
        if o.shuffle:
            order = length_order(src_len, tgt_len if self.sources.with_target else None, rng)
        else:  # validation: by (cost, src), ties in sample order; no randomness
            cost = np.maximum(src_len, tgt_len)
            order = np.lexsort((src_len, cost))
        dirs, rows, src_len, tgt_len = dirs[order], rows[order], src_len[order], tgt_len[order]
        shape = masked = packed = None
        if o.pack_shape:
            dirs, rows, src_len, tgt_len, ends, masked, packed = self._packed_batches(dirs, rows, src_len, tgt_len,
                                                                                       rng)
        elif o.shapes:
            dirs, rows, src_len, tgt_len, ends, shape, masked, unfit = self._static_batches(dirs, rows, src_len, tgt_len)
            filtered = filtered + np.bincount(unfit, minlength=len(setup.directions))
        else:
            cost = np.maximum(src_len, tgt_len)
            ends = batch_sorted(cost, o.max_tokens, o.max_sentences or None, o.multiple)
        served = self._block_shuffle(len(ends), rng) if o.shuffle else np.arange(len(ends))
        win = Window(epoch, w, dirs, rows, src_len.astype(np.int32), tgt_len.astype(np.int32), ends, served, shape,
                     masked, packed)
        return self._remember(setup, win, filtered)

    def _remember(self, setup: EpochSetup, win: Window, filtered: np.ndarray) -> Window:
        """Record a planned window: its batch count, its filtered and masked counts, and the one-window cache."""
        self._filtered.setdefault(win.epoch, {})[win.index] = filtered
        if win.masked is not None:
            self._masked.setdefault(win.epoch, {})[win.index] = int(win.masked.sum())  # rows (packing: of pairs)
        setup.window_batches[win.index] = len(win)
        self._window_cache = ((win.epoch, win.index), win)
        return win

    def rows_per_packed_batch(self) -> int:
        o = self.opts
        b = max(1, o.max_tokens // max(o.pack_shape))
        if o.max_sentences:
            b = min(b, o.max_sentences)
        return b - b % o.multiple if b >= o.multiple else b

    def _packed_batches(self, dirs, rows, src_len, tgt_len, rng):
        """Pack the window's pairs side by side into rows of ``pack_shape`` (first-fit decreasing, ties in random
        order), then cut the rows into batches of B rows; the last batch's missing rows are counted as masked."""
        ls, lt = self.opts.pack_shape
        shuffle = rng.permutation(len(rows)) if self.opts.shuffle else np.arange(len(rows))
        dirs, rows, src_len, tgt_len = dirs[shuffle], rows[shuffle], src_len[shuffle], tgt_len[shuffle]
        plan = pack_pairs(src_len, tgt_len, ls, lt)
        order = np.lexsort((plan.src_offset, plan.row))
        dirs, rows, src_len, tgt_len = dirs[order], rows[order], src_len[order], tgt_len[order]
        prow, soff, toff = plan.row[order], plan.src_offset[order], plan.tgt_offset[order]
        b = self.rows_per_packed_batch()
        n_batches = -(-plan.num_rows // b)
        ends = np.searchsorted(prow, (np.arange(n_batches) + 1) * b, side="left").astype(np.int64)
        masked = np.zeros(n_batches, np.int64)
        if n_batches:
            masked[-1] = n_batches * b - plan.num_rows
        packed = {"row": prow % b, "src_offset": soff, "tgt_offset": toff}
        return dirs, rows, src_len, tgt_len, ends, masked, packed

    def _static_batches(self, dirs, rows, src_len, tgt_len):
        """Group the length-ordered samples by the first shape they fit; cut each group into batches of exactly
        that shape's B rows, the last one completed with masked rows. Samples that fit no shape are returned as
        ``unfit`` (their directions), counted with the filtered ones."""
        o = self.opts
        widths = np.array([s[1:] for s in o.shapes], dtype=np.int64)
        sizes = np.array([s[0] for s in o.shapes], dtype=np.int64)
        fits = src_len[:, None] <= widths[None, :, 0]
        if widths.shape[1] > 1 and self.sources.with_target:
            fits &= tgt_len[:, None] <= widths[None, :, 1]
        k = np.where(fits.any(axis=1), fits.argmax(axis=1), -1)
        unfit = dirs[k < 0]
        if len(unfit) and o.on_too_long == "raise":
            i = int(np.flatnonzero(k < 0)[0])
            raise ValueError(f"a sample of {int(src_len[i])} source / {int(tgt_len[i])} target tokens fits none of "
                             f"the static shapes {list(o.shapes)}")
        keep = k >= 0
        grouped = np.argsort(k[keep], kind="stable")
        dirs, rows, src_len, tgt_len, k = (x[keep][grouped] for x in (dirs, rows, src_len, tgt_len, k))
        counts = np.bincount(k, minlength=len(sizes))
        ends, shape, masked = [], [], []
        start = 0
        for s_idx, n in enumerate(counts.tolist()):
            b = int(sizes[s_idx])
            for first in range(0, n, b):
                real = min(b, n - first)
                ends.append(start + first + real)
                shape.append(s_idx)
                masked.append(b - real)
            start += n
        return (dirs, rows, src_len, tgt_len, np.asarray(ends, np.int64), np.asarray(shape, np.int64),
                np.asarray(masked, np.int64), unfit)

    def _fairseq_window(self, setup, epoch, w, dirs, rows, src_len, tgt_len) -> Window:
        """fairseq's multilingual epoch, as TranslationMultiSimpleEpochTask + EpochBatchIterator build it.

        The virtual dataset is the draw of every direction concatenated in direction order; then
        ``ordered_indices`` (``np.random.seed(seed)``, a permutation, stable sorts by target and by source
        length), ``filter_indices_by_size`` (order kept), ``batch_by_size`` on ``max(src, tgt)``, and the
        epoch iterator's ``np.random.seed(seed + epoch); np.random.shuffle(batches)``; rank r then takes
        batches r, r + W, ... (``ShardedIterator``), which is global batch g on rank g % W here too.
        """
        o = self.opts
        order = fairseq_ordered_indices(src_len, tgt_len if self.sources.with_target else None, o.seed)
        too_long = (src_len[order] > o.max_source_positions) | (tgt_len[order] > o.max_target_positions)
        filtered = np.bincount(dirs[order][too_long], minlength=len(setup.directions)).astype(np.int64)
        if too_long.any() and o.on_too_long == "raise":
            i = int(order[np.flatnonzero(too_long)[0]])
            raise ValueError(f"{setup.directions[int(dirs[i])].key} row {int(rows[i])} is longer than "
                             f"max_source_positions/max_target_positions (filter.on_too_long='raise')")
        order = order[~too_long]
        cost = np.maximum(src_len, tgt_len)
        batches = fairseq_batch_by_size(order, cost, o.max_tokens, o.max_sentences or None, o.multiple,
                                        drop_last_partial=o.fairseq_drop_last)
        ends = np.cumsum([len(b) for b in batches]).astype(np.int64)
        served = list(range(len(batches)))
        np.random.RandomState(o.seed + epoch).shuffle(served)
        win = Window(epoch, w, dirs[order], rows[order], src_len[order].astype(np.int32),
                     tgt_len[order].astype(np.int32), ends, np.asarray(served, dtype=np.int64))
        return self._remember(setup, win, filtered)

    def _block_shuffle(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Batches in cost order, cut into blocks of ``balance_block``; blocks and their members shuffled.

        Consecutive global batches then cost about the same, so the batches of one step (one per rank) are
        balanced for any world size up to the block size, while the global order stays independent of it.
        """
        q = self.opts.balance_block
        blocks = [np.arange(s, min(s + q, n)) for s in range(0, n, q)]
        out = [rng.permutation(blocks[i]) for i in rng.permutation(len(blocks))]
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def window_start(self, epoch: int, w: int) -> int:
        """Global index of window w's first batch (plans earlier windows' integers if needed)."""
        setup = self.setup(epoch)
        start = 0
        for k in range(w):
            if k not in setup.window_batches:
                self.window(epoch, k)
            start += setup.window_batches[k]
        return start

    def locate(self, epoch: int, g: int, hint: tuple[int, int] = (0, 0)) -> tuple[int, int] | None:
        """(window, position in window) of global batch g, or None when the epoch has fewer batches."""
        setup = self.setup(epoch)
        w, start = hint
        if start > g:
            w, start = 0, 0
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

    def num_batches(self, epoch: int) -> int:
        """Batches in the epoch (plans every window's integers the first time)."""
        setup = self.setup(epoch)
        w = 0
        while self._exists(setup, w):
            if w not in setup.window_batches:
                self.window(epoch, w)
            w += 1
        return sum(setup.window_batches[k] for k in range(w))

    def _exists(self, setup: EpochSetup, w: int) -> bool:
        """Whether the epoch has a window w (stream sampler: plans the windows before it to find out)."""
        if setup.num_windows >= 0:
            return w < setup.num_windows
        self._plan_marks(setup, w)
        return w in setup.stream and setup.stream[w].sample < setup.samples

    def masked_rows(self, epoch: int) -> int:
        """Rows added to fill static-shape batches in ``epoch``, over the windows planned so far."""
        return int(sum(self._masked.get(epoch, {}).values()))

    def filtered(self, epoch: int) -> np.ndarray:
        """Too-long samples per direction in ``epoch``, over the windows planned so far."""
        out = np.zeros(len(self.sources.keys), dtype=np.int64)
        for counts in self._filtered.get(epoch, {}).values():
            out += counts
        return out

    def fingerprint(self) -> str:
        comps = [(c.key, c.shard, len(c), c.src_prefix.tolist(), c.tgt_prefix.tolist()) for c in self.sources.components]
        opts = asdict(self.opts)
        if self.opts.schedule is None or not self.opts.schedule.boundaries:
            opts.pop("batches_per_update")  # only a changing schedule makes the plan depend on it
        blob = json.dumps({"opts": opts, "split": self.sources.split, "shards": self.sources.shards,
                           "components": comps}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class Collater:
    """Planned sample references -> the fairseq batch dict (source noise applied where a task has it)."""

    def __init__(self, sources: SourceSet, opts: CollateOptions, seed: int = 1, max_source_positions: int = 0):
        self.sources, self.opts = sources, opts
        self.seed, self.max_source_positions = seed, max_source_positions
        self.noise_dropped = 0  # rows whose noised source outgrew its limit (weight 0), since construction
        sizes = [len(c) for c in sources.components]
        self.id_base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    @staticmethod
    def _locate(directions: list[Direction], dirs: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(component id, row within the component) of each sample reference (direction, direction row)."""
        comp_ids = np.empty(len(rows), np.int64)
        local = np.empty(len(rows), np.int64)
        for d in np.unique(dirs):
            sel = np.flatnonzero(dirs == d)
            comp_ids[sel], local[sel] = directions[int(d)].locate(rows[sel])
        return comp_ids, local

    def __call__(self, directions: list[Direction], dirs: np.ndarray, rows: np.ndarray, src_len, tgt_len,
                 weight=None, pad_to_length: dict | None = None, sort: bool | None = None, epoch: int = 1) -> dict:
        comp_ids, local = self._locate(directions, dirs, rows)
        ids = self.id_base[comp_ids] + local
        src_len, tgt_len = np.array(src_len, dtype=np.int64), np.array(tgt_len, dtype=np.int64)
        groups_src, groups_tgt = [], []
        for cid in np.unique(comp_ids):
            pos = np.flatnonzero(comp_ids == cid)
            comp = self.sources.components[int(cid)]
            src, src_rows = comp.src, local[pos]
            tgt, tgt_rows = comp.tgt, local[pos]
            if isinstance(src, SampledText):  # raw text: segmented now, within the planned lengths
                sampled = RaggedRecords(src.sample(src_rows, ids[pos], epoch))
                src_len[pos] = sampled.sizes + len(comp.src_prefix)
                if tgt is src:  # monolingual: one segmentation for both sides
                    tgt = sampled
                src, src_rows = sampled, np.arange(len(pos))
            if isinstance(tgt, SampledText):
                tgt = RaggedRecords(tgt.sample(tgt_rows, ids[pos], epoch))
            if isinstance(tgt, RaggedRecords):
                tgt_rows = np.arange(len(pos))
                tgt_len[pos] = tgt.sizes + len(comp.tgt_prefix)
            groups_src.append((pos, src, src_rows, comp.src_prefix))
            if tgt is not None:
                groups_tgt.append((pos, tgt, tgt_rows, comp.tgt_prefix))
        has_tgt = self.sources.with_target
        opts = self.opts if sort is None else dataclasses.replace(self.opts, sort_by_source_length=sort)
        src_ragged = None
        if any(self.sources.components[int(c)].src_noise for c in np.unique(comp_ids)):
            src_ragged, src_len, weight = self._noised_sources(groups_src, comp_ids, ids, src_len, weight, epoch,
                                                               pad_to_length)
        return collate_pairs(groups_src, groups_tgt, src_len, tgt_len if has_tgt else None, ids, opts,
                             weight=weight, pad_to_length=pad_to_length,
                             extra={"direction": np.asarray(dirs, dtype=np.int32)}, src_ragged=src_ragged)

    def _noised_sources(self, groups_src, comp_ids, ids, src_len, weight, epoch, pad_to_length):
        """Sources gathered as one ragged buffer, each task's transforms applied to its rows (randomness from
        seed, epoch and sample id), reassembled in row order. Rows that outgrow the source limit (or the static
        width) keep weight 0 and are cut: filter-too-long after the transforms, never silently."""
        src_len = np.asarray(src_len, dtype=np.int64)
        starts = np.cumsum(src_len) - src_len
        flat = np.zeros((1, int(src_len.sum())), dtype=np.int64)
        fill_at(flat, [(np.zeros(len(p), np.int64), starts[p], ds, r, pre) for p, ds, r, pre in groups_src])
        flat = flat[0]
        new_len = src_len.copy()
        pieces = []  # (rows, Ragged) per distinct transform list
        by_steps: dict = {}
        for cid in np.unique(comp_ids):
            comp = self.sources.components[int(cid)]
            entry = by_steps.setdefault(repr((comp.src_noise, len(comp.src_prefix))),
                                        [comp.src_noise, len(comp.src_prefix), []])
            entry[2].append(np.flatnonzero(comp_ids == cid))
        for steps, plen, parts in by_steps.values():
            rows = np.sort(np.concatenate(parts))
            if not steps:
                pieces.append((rows, None))
                continue
            ragged = Ragged(flat[ragged_arange(starts[rows], src_len[rows])], src_len[rows])
            ctx = NoiseContext(self.seed, epoch, np.asarray(ids)[rows], protect_prefix=plen)
            noised = apply_noise(ragged, ctx, steps)
            new_len[rows] = noised.lengths
            pieces.append((rows, noised))
        out_starts = np.cumsum(new_len) - new_len
        out = np.empty(int(new_len.sum()), dtype=np.int64)
        for rows, noised in pieces:
            dest = ragged_arange(out_starts[rows], new_len[rows])
            out[dest] = flat[ragged_arange(starts[rows], src_len[rows])] if noised is None else noised.tokens
        limit = self.max_source_positions or int(new_len.max(initial=0))
        if pad_to_length and pad_to_length.get("source"):
            limit = min(limit, int(pad_to_length["source"]))
        over = new_len > limit
        weight = np.ones(len(new_len), np.float32) if weight is None else np.asarray(weight, np.float32).copy()
        self.noise_dropped += int((over & (weight > 0)).sum())
        weight[over] = 0
        return (out, new_len), np.minimum(new_len, limit), weight


    def packed(self, directions: list[Direction], dirs: np.ndarray, rows: np.ndarray, placement: dict,
               shape: tuple, row_weight: np.ndarray) -> dict:
        comp_ids, local = self._locate(directions, dirs, rows)
        groups_src, groups_tgt = [], []
        for cid in np.unique(comp_ids):
            pos = np.flatnonzero(comp_ids == cid)
            comp = self.sources.components[int(cid)]
            groups_src.append((placement["row"][pos], placement["src_offset"][pos], comp.src, local[pos],
                               comp.src_prefix))
            groups_tgt.append((placement["row"][pos], placement["tgt_offset"][pos], comp.tgt, local[pos],
                               comp.tgt_prefix))
        batch = collate_packed(groups_src, groups_tgt, placement, shape, self.id_base[comp_ids] + local, self.opts,
                               row_weight)
        batch["direction"] = np.asarray(dirs, dtype=np.int32)
        return batch


class BatchIterator:
    """Batches of the current epoch for one rank, with ``len()``, ``epoch``, ``step`` and exact resume.

    ``split="batches"`` (data parallelism with one batch per rank, torch DDP): global batch g of an epoch goes to
    rank ``g % world_size``. ``split="rows"`` (one global batch per step, JAX multi-host): every rank takes its
    rows ``[r N/W, (r+1) N/W)`` of every global batch, padded to the batch-wide widths, so the per-host pieces
    assemble into one global array; masked rows (weight 0) make N a multiple of W where needed. Either way the
    global order does not depend on the world size. Iterating past the epoch's last step raises StopIteration
    and moves to the next epoch, so ``for epoch ...: for batch in it: ...`` walks epoch after epoch.
    """

    def __init__(self, planner: EpochPlanner, collater: Collater, rank: int = 0, world_size: int = 1,
                 epoch: int = 1, name: str = "train", max_epochs: int | None = None, split: str = "batches"):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if split not in ("batches", "rows"):
            raise ValueError(f"split must be 'batches' or 'rows', got {split!r}")
        if split == "rows" and planner.opts.pack_shape and planner.rows_per_packed_batch() % world_size:
            raise ValueError(f"packed batches of {planner.rows_per_packed_batch()} rows cannot be split evenly over "
                             f"{world_size} ranks")
        self.split = split
        self._per_step = world_size if split == "batches" else 1
        if epoch < 1:
            raise ValueError(f"epochs count from 1, got {epoch}")
        self.planner, self.collater = planner, collater
        self.rank, self.world_size, self.name = rank, world_size, name
        self.max_epochs = max_epochs
        self.epoch = epoch
        self._base = 0  # global batches consumed before this run's first step of the epoch
        self.step = 0  # steps taken by every rank since _base
        self._hint = (0, 0)
        self.total_steps = 0
        self.served: dict[int, dict[int, int]] = {}  # epoch -> direction -> samples served by this rank

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
    def iterations_in_epoch(self) -> int:
        return -(-self._base // self._per_step) + self.step

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self.max_epochs is not None and self.epoch > self.max_epochs:
            raise StopIteration
        start = self.consumed
        if self.planner.locate(self.epoch, start, self._hint) is None:
            self._next_epoch()
            raise StopIteration
        g = start + (self.rank if self.split == "batches" else 0)
        where = self.planner.locate(self.epoch, g, self._hint)
        if where is None:  # the epoch's last step: ranks past its end get a fully masked batch
            batch = self._dummy()
        else:
            w, j = where
            self._hint = (w, self.planner.window_start(self.epoch, w))
            batch = self._collate(w, j)
        self.step += 1
        self.total_steps += 1
        return batch

    def _collate(self, w: int, j: int, weight=None) -> dict:
        """The j-th batch of window w (this rank's rows of it with split="rows"); ``weight`` (zeros) marks an
        epoch-padding batch, which counts as nothing."""
        win = self.planner.window(self.epoch, w)
        sl = win.batch(j)
        setup = self.planner.setup(self.epoch)
        dirs, rows, src_len, tgt_len = win.direction[sl], win.rows[sl], win.src_len[sl], win.tgt_len[sl]
        if win.packed is not None:
            return self._collate_packed(win, j, sl, dirs, rows, weight)
        weight = np.ones(len(rows), np.float32) if weight is None else np.asarray(weight, np.float32)
        shape_idx, masked = win.batch_shape(j)
        pad_to = None
        if shape_idx >= 0:
            shape = self.planner.opts.shapes[shape_idx]
            pad_to = {"source": shape[1], "target": shape[-1]}
        if self.split == "rows":
            masked += (-(len(rows) + masked)) % self.world_size
            if pad_to is None:  # every rank pads to the whole batch's widths
                m = self.collater.opts.pad_to_multiple
                pad_to = {"source": _round_up(int(src_len.max()), m), "target": _round_up(int(tgt_len.max()), m)}
        if masked:  # masked rows repeat real rows (attention stays well-defined) with weight 0
            fill = np.arange(masked) % len(rows)
            dirs, rows, src_len, tgt_len = (np.concatenate([x, x[fill]]) for x in (dirs, rows, src_len, tgt_len))
            weight = np.concatenate([weight, np.zeros(masked, np.float32)])
        sort = None
        if self.split == "rows":  # order the whole global batch first, so the ranks' slices assemble into it
            if self.collater.opts.sort_by_source_length:
                order = np.argsort(-src_len.astype(np.int64), kind="stable")
                dirs, rows, src_len, tgt_len, weight = (x[order] for x in (dirs, rows, src_len, tgt_len, weight))
            per = len(rows) // self.world_size
            mine = slice(self.rank * per, (self.rank + 1) * per)
            dirs, rows, src_len, tgt_len, weight = (x[mine] for x in (dirs, rows, src_len, tgt_len, weight))
            sort = False
        batch = self.collater(setup.directions, dirs, rows, src_len, tgt_len, weight=weight, pad_to_length=pad_to,
                              sort=sort, epoch=self.epoch)
        batch["nsentences"] = int((batch["weight"] > 0).sum())
        self._count_served(dirs[weight > 0])
        return batch

    def _count_served(self, dirs: np.ndarray) -> None:
        served = self.served.setdefault(self.epoch, {})
        for d, n in zip(*np.unique(dirs, return_counts=True)):
            served[int(d)] = served.get(int(d), 0) + int(n)

    def _collate_packed(self, win: Window, j: int, sl: slice, dirs, rows, weight) -> dict:
        b = int(win.order[j])
        n_rows = self.planner.rows_per_packed_batch()
        masked = int(win.masked[b])
        real_rows = n_rows - masked
        place = {k: v[sl] for k, v in win.packed.items()}
        src_len, tgt_len = win.src_len[sl].astype(np.int64), win.tgt_len[sl].astype(np.int64)
        row_weight = np.concatenate([np.ones(real_rows, np.float32), np.zeros(masked, np.float32)])
        if weight is not None and not np.any(weight):
            row_weight[:] = 0  # an epoch-padding batch
        if masked:  # repeat real rows (attention stays well-defined), weight 0
            pick = [np.flatnonzero(place["row"] == (i % real_rows)) for i in range(masked)]
            extra = np.concatenate(pick)
            new_rows = np.concatenate([np.full(len(p), real_rows + i) for i, p in enumerate(pick)])
            dirs, rows = np.concatenate([dirs, dirs[extra]]), np.concatenate([rows, rows[extra]])
            src_len, tgt_len = np.concatenate([src_len, src_len[extra]]), np.concatenate([tgt_len, tgt_len[extra]])
            place = {"row": np.concatenate([place["row"], new_rows]),
                     "src_offset": np.concatenate([place["src_offset"], place["src_offset"][extra]]),
                     "tgt_offset": np.concatenate([place["tgt_offset"], place["tgt_offset"][extra]])}
        place["src_len"], place["tgt_len"] = src_len, tgt_len
        if self.split == "rows":  # this rank's rows of the packed batch
            per = n_rows // self.world_size
            lo = self.rank * per
            keep = (place["row"] >= lo) & (place["row"] < lo + per)
            dirs, rows = dirs[keep], rows[keep]
            place = {k: (v[keep] - lo if k == "row" else v[keep]) for k, v in place.items()}
            row_weight = row_weight[lo:lo + per]
        setup = self.planner.setup(self.epoch)
        batch = self.collater.packed(setup.directions, dirs, rows, place, tuple(self.planner.opts.pack_shape),
                                     row_weight)
        self._count_served(dirs[row_weight[place["row"]] > 0])
        return batch

    def batch_at(self, k: int) -> dict:
        """This rank's k-th batch of the current epoch, by random access (for worker pools such as grain's).

        Does not move the iterator; batches of one window are cheapest when asked for in order.
        """
        if not 0 <= k < len(self):
            raise IndexError(f"batch {k} out of range: this rank has {len(self)} batches in epoch {self.epoch}")
        g = k * self._per_step + (self.rank if self.split == "batches" else 0)
        where = self.planner.locate(self.epoch, g)
        return self._dummy() if where is None else self._collate(*where)

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

    # ----------------------------------------------------------------------------------------- state
    def get_state(self) -> dict:
        """A small JSON-serialisable dict; the same on every rank at the same step."""
        c = self.consumed
        epoch = self.epoch
        if self.planner.locate(epoch, c, self._hint) is None and c > 0:
            epoch, c = epoch + 1, 0  # finished epoch: resume at the start of the next
        state = {"version": STATE_VERSION, "name": self.name, "epoch": epoch, "consumed": c,
                 "total_steps": self.total_steps, "fingerprint": self.planner.fingerprint()}
        if self.planner.opts.sampler == "stream":  # where every stream stood when this epoch began
            positions, batches = self.planner.epoch_start(epoch)
            state["stream"] = {"positions": positions.tolist(), "batches": int(batches)}
        return state

    def set_state(self, state: dict, strict: bool = True) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unknown iterator state version {state.get('version')!r}")
        fp = self.planner.fingerprint()
        if strict and state.get("fingerprint") != fp:
            raise ValueError(
                f"iterator state was saved with different data or settings (fingerprint {state.get('fingerprint')} "
                f"!= {fp}): resuming would not continue the same stream. Pass strict=False to resume anyway.")
        self.epoch = int(state["epoch"])
        if self.planner.opts.sampler == "stream" and "stream" in state:
            self.planner.set_epoch_start(self.epoch, state["stream"]["positions"], state["stream"]["batches"])
        self._base = int(state["consumed"])
        self.step = 0
        self._hint = (0, 0)
        self.total_steps = int(state.get("total_steps", 0))

    # ----------------------------------------------------------------------------------------- reports
    def update(self) -> float:
        """Stream sampler: the optimizer update the next batch belongs to, as the mixing schedule counts it
        (global batches since training began / batches per update)."""
        o = self.planner.opts
        if o.sampler != "stream":
            raise ValueError("the update count is kept by mixing.sampler='stream' (or 'auto' with a schedule)")
        return (self.planner.epoch_start(self.epoch)[1] + self.consumed) / o.batches_per_update

    def task_stats(self) -> dict:
        """Per task: its probability now, the samples drawn from it since training began (up to the current
        global position, every rank's batches included; too-long samples count when their window is entered),
        its size, its epochs (passes over its own data: each task cycles its data independently), and the
        samples this rank served in this run. Stream sampler only."""
        planner = self.planner
        if planner.opts.sampler != "stream":
            raise ValueError("per-task positions exist with mixing.sampler='stream' (or 'auto' with a schedule)")
        setup = planner.setup(self.epoch)
        where = planner.locate(self.epoch, self.consumed, self._hint)
        if where is None:  # the epoch is over: every stream stands where the next epoch starts
            positions = planner.epoch_start(self.epoch + 1)[0]
            mark = planner.stream_mark(self.epoch, max(setup.num_windows - 1, 0))
        else:  # the window's start, plus the samples of its batches served so far (by every rank)
            w, j = where
            mark, win = planner.stream_mark(self.epoch, w), planner.window(self.epoch, w)
            taken = [win.direction[win.batch(k)] for k in range(j)]
            done = np.concatenate(taken) if taken else np.zeros(0, np.int64)
            positions = mark.positions + np.bincount(done, minlength=len(mark.positions))
        probs = planner.probabilities(setup.directions, mark.update)
        sizes = np.array([d.size for d in setup.directions], np.int64)
        served = np.zeros(len(sizes), np.int64)
        for per_epoch in self.served.values():
            for d, n in per_epoch.items():
                served[d] += n
        task_of = planner.sources.task_of
        out = {}
        for t, name in enumerate(planner.sources.tasks):
            m = task_of == t
            samples, size = int(positions[m].sum()), int(sizes[m].sum())
            out[name] = {"probability": float(probs[m].sum()), "samples": samples, "size": size,
                         "epochs": samples / size if size else 0.0, "served": int(served[m].sum())}
        return out

    def stats(self, epoch: int | None = None) -> dict:
        """Per direction, for ``epoch`` (default: the current one): its probability, the samples planned, those
        filtered as too long (in the windows planned so far), and those this rank served."""
        epoch = self.epoch if epoch is None else epoch
        setup = self.planner.setup(epoch)
        served = self.served.get(epoch, {})
        return {d.key: {"probability": float(p), "planned": int(c), "filtered": int(f), "served": served.get(i, 0)}
                for i, (d, p, c, f) in enumerate(zip(setup.directions, setup.probs, setup.counts,
                                                     self.planner.filtered(epoch)))}
