"""A planned window's per-sample rows (``Samples``) and its batches (``Window``): integers only (plan.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from babelfeed._native import plan_kernel


class Samples:
    """Per-sample facts of planned samples, one int64 row each (24 bytes), so that reordering a window or taking a
    batch moves whole rows in one gather: the stream (``direction``) and component (int32 pair), the lengths
    (int32 pair, prefixes and </s> included) and the row in the component (``local``). Where the tokens lie is
    looked up once per window for the batches a rank gathers, into ``addr`` (source and target token-space
    addresses, int64 [n, 2]; see ``BatchIterator._samples``)."""

    __slots__ = ("m", "addr")
    COLUMNS = 3

    def __init__(self, m: np.ndarray, addr: np.ndarray | None = None):
        self.m, self.addr = m, addr

    @classmethod
    def empty(cls, n: int) -> "Samples":
        return cls(np.zeros((n, cls.COLUMNS), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.m)

    def __getitem__(self, idx) -> "Samples":
        if isinstance(idx, np.ndarray) and idx.dtype.kind in "iu":  # np.take moves 24-byte rows ~3x faster
            m = plan_kernel.take_rows(self.m, idx) if self.addr is None else None  # compiled: prefetched
            return Samples(np.take(self.m, idx, axis=0) if m is None else m,
                           None if self.addr is None else np.take(self.addr, idx, 0))
        return Samples(self.m[idx], None if self.addr is None else self.addr[idx])

    def concat(self, other: "Samples") -> "Samples":
        addr = None if self.addr is None or other.addr is None else np.concatenate([self.addr, other.addr])
        return Samples(np.concatenate([self.m, other.m]), addr)

    @property
    def _pairs(self) -> np.ndarray:
        return self.m[:, :2].view(np.int32)

    direction = property(lambda self: self._pairs[:, 0])
    comp = property(lambda self: self._pairs[:, 1])
    src_len = property(lambda self: self._pairs[:, 2])
    tgt_len = property(lambda self: self._pairs[:, 3])
    local = property(lambda self: self.m[:, 2])


@dataclass
class Window:
    epoch: int
    index: int
    samples: Samples  # per sample, in batch order
    ends: np.ndarray  # batch b = [ends[b-1], ends[b]) of the plan order
    order: np.ndarray  # served position j -> batch b
    shape: np.ndarray | None = None  # static shapes: the shape of each batch
    masked: np.ndarray | None = None  # static shapes and packing: rows added to fill each batch (weight 0)
    packed: dict | None = None  # packing: per sample "row" (in its batch), "src_offset", "tgt_offset"
    addr: np.ndarray | None = None  # token addresses [n, 2], -1 until a rank that gathers the sample looks them up
    addr_ahead: int = 0  # served batches whose addresses the next lookup fetches (doubles at each lookup)

    direction = property(lambda self: self.samples.direction)
    src_len = property(lambda self: self.samples.src_len)
    tgt_len = property(lambda self: self.samples.tgt_len)

    def __len__(self) -> int:
        return len(self.order)

    def batch(self, j: int) -> slice:
        b = int(self.order[j])
        return slice(int(self.ends[b - 1]) if b else 0, int(self.ends[b]))

    def batch_rows(self, js: np.ndarray) -> np.ndarray:
        """Indices (plan order) of the samples of served batches ``js``, batch after batch."""
        start, n = self._bounds(js)
        return np.repeat(start - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))

    def batch_sizes(self, js: np.ndarray) -> np.ndarray:
        """Samples in each of served batches ``js``."""
        return self._bounds(js)[1]

    def _bounds(self, js) -> tuple[np.ndarray, np.ndarray]:
        b = self.order[np.asarray(js, dtype=np.int64)]
        stop = self.ends[b].astype(np.int64)
        start = np.where(b > 0, self.ends[np.maximum(b - 1, 0)], 0).astype(np.int64)
        return start, stop - start

    def batch_shape(self, j: int) -> tuple[int, int]:
        """(shape index, masked rows) of the j-th served batch; (-1, 0) for dynamic batches."""
        if self.shape is None:
            return -1, 0
        b = int(self.order[j])
        return int(self.shape[b]), int(self.masked[b])


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
    window_counts: dict = field(default_factory=dict)  # stream sampler: window -> samples per stream it drew

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def epochs(self) -> np.ndarray:
        """Per direction, how many times its data this epoch serves (samples over its size, the shard it reads;
        before filtering): its up-sampling. The stream sampler: at the epoch's starting weights."""
        counts = np.asarray(self.expected if self.expected is not None else self.counts, np.float64)
        sizes = np.array([d.size for d in self.directions], np.float64)
        return np.divide(counts, sizes, out=np.zeros(len(sizes)), where=sizes > 0)

    def upsampling_notice(self, threshold: float, where: str = "", method: str = "temperature",
                          cap: float = 0.0) -> str | None:
        """One line naming every direction served more than ``threshold`` times its data this epoch (most first)
        and the settings that lower it (for the run's ``method`` and ``cap``), and every direction a cap leaves
        with no sample; None when there is neither (``threshold`` 0: no up-sampling line). ``where``: the
        config's section (``"train."`` for configs/demo.py)."""
        times = self.epochs()
        lines = []
        over = np.flatnonzero(times > threshold) if threshold > 0 else np.zeros(0, np.int64)
        if len(over):
            over = over[np.argsort(-times[over], kind="stable")]
            named = ", ".join(f"{self.directions[i].key} {times[i]:.1f}x ({_sentences(self.directions[i].size)})"
                              for i in over[:8].tolist())
            more = f" and {len(over) - 8:,} more" if len(over) > 8 else ""
            if cap:
                knobs = f"a lower {where}mixing.max_upsample (now {cap:g}: every direction at most that many times its data)"
            else:
                knobs = (f"a lower {where}mixing.temperature, {where}mixing.max_upsample=N (every direction at most N "
                         f"times its data, the excess to the others) or {where}mixing.method='unimax' with it"
                         if method == "temperature" else
                         f"{where}mixing.max_upsample=N (every direction at most N times its data, the excess to the "
                         f"others)")
            lines.append(f"epoch {self.epoch} serves {len(over):,} of {len(times):,} directions more than {threshold:g} "
                         f"times their data: {named}{more}. To serve them less: {knobs} ({where}mixing.warn_upsample "
                         f"sets this threshold; 0: off)")
        sizes = np.array([d.size for d in self.directions])
        starved = np.flatnonzero((sizes > 0) & (np.floor(sizes * cap) < 1)) if cap else np.zeros(0, np.int64)
        if len(starved):
            named = ", ".join(f"{self.directions[i].key} ({_sentences(self.directions[i].size)})"
                              for i in starved[:8].tolist())
            more = f" and {len(starved) - 8:,} more" if len(starved) > 8 else ""
            lines.append(f"{where}mixing.max_upsample={cap:g} leaves {len(starved):,} direction(s) with no sample in "
                         f"epoch {self.epoch} (fewer than one sentence's worth): {named}{more}")
        return "; ".join(lines) or None


def _sentences(n: int) -> str:
    return f"{n:,} sentence" + ("" if n == 1 else "s")

