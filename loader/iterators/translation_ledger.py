"""A translation run's ledger, counted from its plan: what every rank together has consumed up to a position.

Per stream, samples and tokens (source and target, as stored): the totals when the epoch (or its edited part)
began, which the run record keeps (``run.ledger``), plus the windows before the position and the served part of its
window (``EpochPlanner.consumed_totals``); what the run's skips dropped is counted apart, never served. Part of
:class:`~babelfeed.iterators.translation.BatchIterator` (its planner, record, skips and position).
"""

from __future__ import annotations

import numpy as np

from babelfeed.errors import UsageError
from babelfeed.iterators.protocol import MAX_EPOCHS_AHEAD
from babelfeed.plan.samples import Window
from babelfeed.plan.totals import window_totals


class PlanLedger:
    """The ledger of a translation run, counted from its plan (see the module)."""

    def ledger_start(self, epoch: int) -> np.ndarray:
        """The ledger's totals when ``epoch`` began (from the state, or every earlier epoch's plan)."""
        if epoch not in self.record.ledger.start:
            from tqdm.auto import tqdm  # loaded when a bar is drawn (tqdm.auto probes for notebooks)

            known = max(e for e in self.record.ledger.start if e < epoch)
            if epoch - known > MAX_EPOCHS_AHEAD:
                raise UsageError(f"counting the ledger of epochs {known:,} to {epoch - 1:,} plans every one of them, and "
                                 f"more than {MAX_EPOCHS_AHEAD:,} are refused (hours on real data): a state without a "
                                 f"ledger this far on (an older babelfeed's) resumes with set_state, whose ledger "
                                 f"then counts from its epoch")
            totals = self.record.ledger.start[known].copy()
            # (a state without a ledger, an older babelfeed's, many epochs on: counted from every epoch's plan)
            for e in tqdm(range(known, epoch), desc="counting the ledger of earlier epochs", unit="epoch",
                          disable=epoch - known < 50, leave=False):
                n = self.planner.num_batches(e)
                totals += self.planner.consumed_totals(e, n) - self.skipped_in(e, n)
                self.record.ledger.start[e + 1] = totals.copy()
        return self.record.ledger.start[epoch]

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
        if epoch not in self.record.ledger.skipped:
            known = max(e for e in self.record.ledger.skipped if e < epoch)
            totals = self.record.ledger.skipped[known].copy()
            for e in range(known, epoch):
                totals += self.skipped_in(e, self.planner.num_batches(e))
                self.record.ledger.skipped[e + 1] = totals.copy()
        return self.record.ledger.skipped[epoch]

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

    def ledger_at(self) -> tuple:
        """Where :meth:`ledger` counts to: :meth:`ledger_totals` here (cheap to take after every batch)."""
        return self.ledger_totals()

    def _ledger(self, prefix: str, at: tuple) -> dict:
        """The ledger at ``at`` (``ledger_totals``): per stream ``samples``, ``src_tokens``, ``tgt_tokens`` and
        ``passes``, and the streams an edit removed as their counts stood (``run.ledger``)."""
        epoch, totals, steps, skipped = at
        rows = np.zeros(len(self.planner.keys), np.int64)
        index = {k: i for i, k in enumerate(self.planner.keys)}
        for c in self.planner.sources.components:
            rows[index[c.key]] += len(c)
        return self.record.ledger.report(totals, self.planner.keys, rows, epoch, steps, prefix, skipped)

