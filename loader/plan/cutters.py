"""How a window's samples are cut into batches: one object per way, chosen once from the config.

* :class:`DynamicCutter`: batches of up to ``max_tokens`` (padded) and ``max_sentences``, a multiple of
  ``required_batch_size_multiple`` rows (``cutting.dynamic``), in length order;
* :class:`StaticCutter`: every batch one of the static shapes (``batching.num_shapes`` / ``batching.shapes``),
  rows added to fill a shape masked (``cutting.static``);
* :class:`PackedCutter`: pairs packed side by side into rows of one shape (``batching.pack``, ``cutting.packed``);
* :class:`FairseqCutter`: ``compat="fairseq"``, fairseq's own order and batches (``cutting.fairseq``).

The first three cut the samples the planner has filtered and ordered by length; fairseq's filters and orders
as fairseq does. Adding a way is a class here and a line in :func:`choose`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from babelfeed.plan import copies, cutting
from babelfeed.errors import DataError


@dataclass
class Cut:
    """A window's batches: ``sub`` (the samples' batch order; None: as they are), ``ends`` (each batch's end),
    and, per way, ``shape`` (each batch's static shape), ``masked`` (rows added per batch), ``packed`` (rows per
    packed batch), ``unfit`` (samples no shape fits: filtered)."""

    sub: np.ndarray | None
    ends: np.ndarray
    shape: np.ndarray | None = None
    masked: np.ndarray | None = None
    packed: object = None
    unfit: np.ndarray | None = None


def _candidates(o, s, may_repeat):
    """The samples that may be copies of another, for ``spread_copies``: None (every one), a bool per sample, or
    False where none may (spreading off, or no direction drawn beyond its rows: nothing to spread, and no
    per-sample pass over the window)."""
    if not o.spread_copies or (may_repeat is not None and not may_repeat.any()):
        return False
    return None if may_repeat is None else may_repeat[s.direction]


class DynamicCutter:
    name = "dynamic"
    orders = True  # cuts the samples the planner filtered and ordered by length
    wide = False  # lengths as the int32 columns they are read from

    def cut(self, planner, s, src_len, tgt_len, rng, may_repeat=None) -> Cut:
        """``s``: the window's samples in length order; ``may_repeat``: per direction, whether its samples may be
        copies of another (it is drawn more often than it has rows; None: every one may), for
        ``batching.spread_copies``."""
        o = planner.opts
        ends = cutting.dynamic(src_len, tgt_len, o.max_tokens, o.max_sentences, o.multiple, ordered=True)
        candidates = _candidates(o, s, may_repeat)
        if candidates is False:
            return Cut(None, ends)
        got = copies.spread(copies.identities(s.comp, s.local), src_len, tgt_len, ends, o.max_tokens,
                            o.max_sentences, o.multiple, candidates, o.max_repeats)
        return Cut(None, ends) if got is None else Cut(*got)


class StaticCutter(DynamicCutter):
    name = "static"
    wide = True

    def cut(self, planner, s, src_len, tgt_len, rng, may_repeat=None) -> Cut:
        o = planner.opts
        sub, ends, shape, masked, unfit = cutting.static(src_len, tgt_len, o.shapes, planner.sources.with_target,
                                                         o.on_too_long)
        candidates = _candidates(o, s, may_repeat)
        if candidates is not False and len(sub):
            order = copies.deal(copies.identities(s.comp[sub], s.local[sub]), ends, shape,
                                None if candidates is None else candidates[sub])
            if order is not None:
                sub = sub[order]
        return Cut(sub, ends, shape, masked, unfit=unfit)


class PackedCutter(DynamicCutter):
    name = "packed"
    wide = True

    def cut(self, planner, s, src_len, tgt_len, rng, may_repeat=None) -> Cut:
        o = planner.opts
        sub, ends, masked, packed = cutting.packed(src_len, tgt_len, o.pack_shape, planner.rows_per_packed_batch(),
                                                   rng if o.shuffle else None)
        return Cut(sub, ends, masked=masked, packed=packed)


class FairseqCutter:
    """fairseq's filter, order and batches (``cutting.fairseq``): one window per epoch, as fairseq plans it."""

    name = "fairseq"
    orders = False

    def window(self, planner, setup, epoch: int, w: int, dirs, rows, spans):
        o = planner.opts
        dirs = planner._directions(dirs, spans)
        s = planner._describe(setup, dirs, rows, spans)
        src_len, tgt_len = s.src_len.astype(np.int64), s.tgt_len.astype(np.int64)
        select, ends, served, dropped = cutting.fairseq(
            src_len, tgt_len, planner.sources.with_target, o.seed, epoch, o.max_tokens, o.max_sentences, o.multiple,
            o.max_source_positions, o.max_target_positions, o.fairseq_drop_last)
        if len(dropped) and o.on_too_long == "raise":
            i = int(dropped[0])
            raise DataError(f"{setup.directions[int(dirs[i])].key} row {int(rows[i])} is longer than "
                            f"max_source_positions/max_target_positions ({o.too_long_key}='raise')")
        filtered = np.bincount(dirs[dropped], minlength=len(setup.directions)).astype(np.int64)
        return planner._finish(setup, epoch, w, s, select, ends, served, filtered)


def choose(opts):
    """The cutter of a planner's options."""
    if opts.compat == "fairseq":
        return FairseqCutter()
    if opts.pack_shape:
        return PackedCutter()
    if opts.shapes:
        return StaticCutter()
    return DynamicCutter()
