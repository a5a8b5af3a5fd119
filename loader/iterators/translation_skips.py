"""A translation run's skips, as the run names them: steps, sample ids and ``where`` terms turned into the
events the run record keeps (``run.skips``, the one engine that then drops their rows).

Part of :class:`~babelfeed.iterators.translation.BatchIterator` (``LoaderIterator.skip``'s hooks: its planner,
sources, step count and position).
"""

from __future__ import annotations

import numpy as np

from babelfeed.errors import SkipError
from babelfeed.iterators.protocol import MAX_EPOCHS_AHEAD
from babelfeed.run.history import world_size_at
from babelfeed.run.skips import TERMS, Skips, as_ranges, name_list, range_arg, step_range, where_terms


class TranslationSkips:
    """``skip``'s translation half: what a skip names, checked against the run's streams, shards and steps."""

    def _skip_position(self) -> dict:
        return {"epoch": int(self.epoch), "batch": int(self.consumed)}

    def _skips_changed(self) -> None:
        self._fillers = {}

    def _refuse_skipping_everything(self, event: dict) -> None:
        """Refuse a skip that, with the run's earlier ones, drops every sample of the mixture: no batch could be
        filled any more (and a checkpoint saved after it would hold a run that cannot go on)."""
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
        t = self.total_steps
        a, b = step_range(steps, t)
        if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)
                                       or world_size < 1):
            raise SkipError(f"world_size must be an integer >= 1, got {world_size!r}")
        per = self._per_step
        if self.split == "batches":  # (with split="rows" a step is one global batch on any world size)
            took = world_size_at(self.record.steps.segments, t) if t else None  # the world size that took the last step
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

