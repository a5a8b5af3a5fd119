"""An LM run's record side: its state, its blend over time, its skips as the run names them, trace and ledger.

``get_state`` writes the run record (``run.record``) at ``consumed_samples``, whose history holds the blend's
segments (``babelfeed.lm.mixture``): from a global sample on, weights per dataset and where each dataset stood.
``set_weights`` and a resumed edit add a segment, so every dataset goes on from its position. ``trace``,
``batch_for_step`` and the ledger read a run through :meth:`LMRun.run_of`. Part of
:class:`~babelfeed.lm.iterator.LMIterator`.
"""

from __future__ import annotations

import copy

import ml_collections
import numpy as np

from babelfeed.errors import HistoryError, SkipError, StateError, StateMismatch, UsageError
from babelfeed.iterators.replay import configs_of
from babelfeed.iterators.state import find_state
from babelfeed.lm.mixture import add, arrays, check_offsets, first_event, offsets_at
from babelfeed.run.edits import EditReport, config_changes
from babelfeed.run.history import check, upgrade
from babelfeed.run.record import check_mixture_change, no_strict
from babelfeed.run.skips import LM_TERMS, as_ranges, name_list, range_arg, step_range, where_terms
from babelfeed.sources.corpus import reusing


class LMRun:
    """The LM iterator's state, blend, skips, trace and ledger (see the module)."""

    # ----------------------------------------------------------------------------------------- state
    def get_state(self) -> dict:
        """The record's envelope (``run.record``) at ``consumed_samples``: its history lists the world sizes, the
        edits, the skips, and the blend's segments (``babelfeed.lm.mixture``) from the config's weights at sample
        0."""
        blend = self.record.weights.blend
        if not blend:
            self.record.weights.blend = [self._first_event()]
        try:
            fields = {"config": self.config_snapshot} if self.config_snapshot else {}
            if self.record.ledger.dormant:
                fields["dormant"] = dict(self.record.ledger.dormant)
            return self.record.envelope({"consumed_samples": self.consumed}, self.fingerprint(), self.identity(),
                                        fields)
        finally:
            self.record.weights.blend = blend

    def set_state(self, state: dict, mixture_change: str = "refuse", *, strict=None) -> None:
        """Continue after ``state`` (from ``get_state()``). A state of another config: ``mixture_change``
        (``protocol.MIXTURE_CHANGES``) says what to do. ``"allow"``: this config's blend differs from the saved
        run's (other weights, a dataset added or removed): every dataset goes on from its position, blended with
        this config's weights from the next step; a change to a kept dataset's data, or to ``seq_len``, ``mode``,
        ``seed`` or the split, is refused (they change the samples). ``"keep_position"``: this config's blend from
        the state's sample on, said out loud."""
        no_strict(strict)
        check_mixture_change(mixture_change)
        strict = mixture_change != "keep_position"
        state = self._state_in(state)
        if (mixture_change == "allow" and isinstance(state, dict)
                and state.get("fingerprint") not in self.fingerprints()):
            return self._resume_edited(state)
        self._check_state(state, strict, {"consumed_samples": 0}, optional=self.STATE_FIELDS)
        consumed = state["consumed_samples"]
        if consumed % self.global_batch or consumed > self.num_samples:
            raise StateError(f"consumed_samples={consumed} must be a multiple of global_batch={self.global_batch} "
                             f"and at most num_samples={self.num_samples}")
        events = self._events_of(state)
        self.record.skips.check(self.record.read(state).skips, lm=True, at=consumed)
        before = (self.record.weights.blend, self.dataset_index, self.dataset_sample)
        self._set_blend(events)
        missing = self._missing(int(consumed), self.num_samples)
        if missing:
            self.record.weights.blend, self.dataset_index, self.dataset_sample = before
            raise StateError(f"this state's blend takes samples from dataset {missing}: resume with the run's "
                             f"data_path and data")
        self._load_record(state, int(consumed))
        self.consumed = int(consumed)
        if not strict:
            self._say_kept_position(state)

    STATE_FIELDS = ("history", "config", "dormant")

    def _load_record(self, state: dict, consumed: int) -> None:
        """The state's skips, edits, world sizes and dormant datasets into this run's record (its blend is read
        apart)."""
        self.record.ledger.check(state)
        self.record.ledger.dormant = dict(state.get("dormant") or {})
        views = self.record.read(state)
        steps = consumed // self.global_batch
        self.record.skips.set_state(views.skips, lm=True, at=consumed)
        self.record.edits.set_state(views.edits, steps, (1, steps))
        self.record.steps.resume(views.steps, views.splits, steps, 1, steps)
        self._ledger_cache = None

    def run_of(self, state):
        """A copy of this iterator standing where the run whose ``state`` it is stands (any checkpoint holding
        one), with its blend and skips: what trace, replay and the ledger read a run through. The state is checked
        against this data and these settings; a state of an edited blend names its datasets in its history, so any
        config of the run with the same settings reads it. This iterator is left as it was."""
        state = upgrade(find_state(state, "state"))  # (a checkpoint holding it: {"data": state}, a loader's)
        events = self._events_of(state)
        self._check_state(state, not events, {"consumed_samples": 0}, optional=self.STATE_FIELDS)
        if events:
            self._check_blend_only(state, "this state is of a run with other settings")
        probe = copy.copy(self)
        probe.record = copy.deepcopy(self.record)  # (this iterator's record is left as it was)
        if events:
            probe._set_blend(events)
        probe._load_record(state, int(state["consumed_samples"]))
        probe.consumed = int(state["consumed_samples"])
        return probe

    def _check_blend_only(self, state: dict, what: str) -> None:
        """Refuse a state whose settings other than the blend (seq_len, mode, seed, split) differ from this
        iterator's: they change every dataset's samples."""
        was = (state.get("identity") or {}).get("opts") or {}
        now = self.identity()["opts"]
        fixed = [k for k in now if k != "data_path weights" and was.get(k) != now[k]]
        if fixed:
            changes = ", ".join(f"{k} {was.get(k)!r} -> {now[k]!r}" for k in fixed)
            raise StateMismatch(f"{what}; {changes} changes every dataset's samples: use the run's settings")

    def _events_of(self, state: dict) -> list:
        """The blend events of a state's history, checked against its position: the first at sample 0, each at
        a global batch boundary no later than ``consumed_samples``, and each event's offsets exactly the samples
        the events before it took from every dataset (``babelfeed.lm.mixture``)."""
        events = check(state["history"]).blend if "history" in state else []
        at = state.get("consumed_samples")
        for i, e in enumerate(events):
            if i == 0 and e["sample"] != 0:
                raise HistoryError(f"iterator state field 'history': an LM run's first blend event is at sample 0 "
                                   f"(the config's weights), this one at {e['sample']}")
            if e["sample"] % self.global_batch or (isinstance(at, int) and e["sample"] > at):
                raise HistoryError(f"iterator state field 'history': blend event {i} is at sample {e['sample']}; "
                                   f"a blend changes at a global batch ({self.global_batch} samples) no later than the "
                                   f"state's consumed_samples={at}")
        check_offsets(events)
        return events

    def _resume_edited(self, state: dict, was=None) -> None:
        """set_state with mixture_change="allow" for a state of another blend (weights or datasets). ``was``: the
        run so far in this process (an in-place edit), whose ledger gives a removed dataset's counts."""
        self._check_state(state, False, {"consumed_samples": 0}, optional=self.STATE_FIELDS)
        self._check_blend_only(state, "an LM mixture edit changes the blend only")
        saved = state.get("identity") or {}
        events = self._events_of(state)
        if not events:  # a state of an older babelfeed: its blend was its config's weights, as its identity says
            weights = (saved.get("opts") or {}).get("data_path weights")
            streams = list((saved.get("streams") or {}))
            if not isinstance(weights, list) or len(weights) != len(streams) or len(set(streams)) != len(streams):
                raise StateError("this LM state carries no blend history (saved by an older babelfeed) and its "
                                 "identity does not say its weights per dataset: resume with the run's data_path, "
                                 "then edit at a later state")
            events = [first_event(streams, weights, streams)]
        at = int(state["consumed_samples"])
        if at > self.num_samples or at % self.global_batch:
            raise StateError(f"consumed_samples={at} must be a multiple of global_batch={self.global_batch} and at "
                             f"most num_samples={self.num_samples}")
        keys, names = self.data_keys(), self.dataset_names()
        last_names = {}
        for e in events:
            last_names.update(e["names"])
        by_name = {n: k for k, n in last_names.items()}
        changed = [n for n, k in zip(names, keys) if n in by_name and by_name[n] != k and by_name[n] not in keys]
        if changed:
            raise StateMismatch(f"dataset(s) {changed} hold other data than when this state was saved (their content "
                                f"digest changed): an edit may add or remove datasets, not change one's data")
        offsets = offsets_at(events, at)
        old = {last_names.get(k, k): w for k, w in events[-1]["weights"].items()}
        event = {"event": "blend", "sample": at, "weights": {k: float(w) for k, w in zip(keys, self.weights)},
                 "offsets": {**offsets, **{k: offsets.get(k, 0) for k in keys}},
                 "names": {**last_names, **dict(zip(keys, names))},
                 "changes": {"data_path": [old, dict(zip(names, self.weights))]}}
        self._set_blend(add(events, event))
        self._load_record(state, at)
        self.consumed = at
        step = at // self.global_batch
        had = {last_names.get(k, k) for e in events for k in e["weights"]}
        self.record.ledger.dormant = self._dormant_after(state, was, step, had - set(names))
        if isinstance(state.get("config"), dict):  # what changed, in the config's words (trace undoes it)
            changes = {k: v for k, v in config_changes(state["config"], self.config_snapshot or {}).items()}
        else:
            changes = dict(event["changes"])
        self.record.edits.add({"step": step, "epoch": 1, "batch": step, "changes": changes})
        self.last_edit = self._report(old, event)
        self.last_edit.say()

    def _dormant_after(self, state: dict, old, step: int, removed: set) -> dict:
        """The counts of the datasets the run had and this config drops, where it stood at global batch ``step``
        (``samples``, ``tokens``, ``passes``; what skips dropped): the saved run's ledger, counted from its data
        (``old``, or an iterator of the config the state carries). A dataset added back counts on from the blend."""
        kept = {k: v for k, v in (state.get("dormant") or {}).items() if k not in self.dataset_names()}
        removed -= set(kept)
        if not removed:
            return kept
        if old is None and isinstance(state.get("config"), dict):
            with reusing(self.datasets()):
                old = self.build_another(ml_collections.ConfigDict(state["config"]), rank=self.rank,
                                     world_size=self.world_size)
            old.set_state(state)
        if old is None:  # (a state without its config: the samples only, from the blend)
            return kept
        totals, skipped = old.ledger_totals(step), old.skipped_totals(step)
        for d, name in enumerate(old.dataset_names()):
            if name in removed:
                kept[name] = {"samples": int(totals[0, d]), "tokens": int(totals[1, d]), "passes": int(totals[2, d])}
                if skipped is not None:
                    kept[name].update(skipped=int(skipped[0, d]), skipped_tokens=int(skipped[1, d]))
        return kept

    def take_edit(self, old):
        """:meth:`edit`'s second half: the run so far (``old``, in this process) goes on under this config."""
        state = old.get_state()
        self._check_state(state, False, {"consumed_samples": 0}, optional=self.STATE_FIELDS)
        self._resume_edited(state, old)
        return self.last_edit

    def _report(self, old: dict, event: dict):
        """The report of a blend edit (``EditReport``): each dataset's share before and after."""
        new = dict(zip(self.dataset_names(), self.weights))
        a, b = sum(old.values()) or 1.0, sum(new.values()) or 1.0
        names = sorted(set(old) | set(new), key=lambda n: (-new.get(n, 0.0), n))
        step = self.consumed // self.global_batch
        return EditReport(step=step + 1, epoch=1, batch=step, changes=dict(event.get("changes", {})),
                          shares={n: (old.get(n, 0.0) / a, new.get(n, 0.0) / b) for n in names},
                          added=sorted(set(new) - set(old)), removed=sorted(set(old) - set(new)))

    # ----------------------------------------------------------------------------------------- blend
    def data_keys(self) -> list[str]:
        """Per blended dataset, the key the blend's history names it by: its content digest (the same files under
        another path are the same dataset), with ``#2``, ``#3`` ... where one dataset is listed more than once."""
        out: list = []
        for s in self.sources:
            k = str(s.data_key)
            out.append(k if k not in out else f"{k}#{sum(1 for x in out if x.split('#')[0] == k) + 1}")
        return out

    def _first_event(self) -> dict:
        return first_event(self.data_keys(), self.weights, self.dataset_names())

    def _set_blend(self, events: list) -> None:
        """Blend by ``events`` (the history's blend segments; [] or the config's own: the config's weights)."""
        if not events or events == [self._first_event()]:
            self.record.weights.blend = []
            self.dataset_index, self.dataset_sample = self._config_blend
        else:
            index_of = {k: i for i, k in enumerate(self.data_keys())}
            self.record.weights.blend = [dict(e) for e in events]
            self.dataset_index, self.dataset_sample = arrays(events, self.num_samples, index_of)
        self._plans = {}
        self._ahead = self._shares = None  # (the batches ahead are another blend's now)
        self._ledger_cache = None

    def _missing(self, lo: int, hi: int) -> str | None:
        """The name of a dataset that gives a sample in ``[lo, hi)`` but is not among this iterator's, if any."""
        gone = np.flatnonzero(self.dataset_index[lo:hi] < 0)
        if not len(gone):
            return None
        sample = lo + int(gone[0])
        event = max((e for e in self.record.weights.blend if e["sample"] <= sample), key=lambda e: e["sample"])
        keys = set(self.data_keys())
        names = [event["names"][k] for k in event["weights"] if k not in keys]
        name = names[0] if names else "?"
        if name in self.dataset_names():  # listed, but its files hold other data now
            return f"{name} (sample {sample}), whose data changed since (its content digest differs)"
        return f"{name} (sample {sample}), which this config does not list (an edit removed it)"

    def _refuse_missing(self, lo: int, hi: int) -> None:
        raise UsageError(f"global sample {lo} of this run came from dataset {self._missing(lo, hi)}: use the "
                         f"config and data of that part of the run")

    _weight_noun = "dataset"

    def weight_names(self) -> list[str]:
        return self.dataset_names()

    def _set_weights(self, scaled: dict) -> None:
        """Blend with ``scaled`` from the next global batch on: every dataset goes on from its position, so over
        the whole run a dataset's samples are its own sequence, none repeated or skipped."""
        names = self.dataset_names()
        at = self.consumed
        if at >= self.num_samples:
            raise UsageError("set_weights after the run's last batch: nothing is left to blend")
        events = self.record.weights.blend or [self._first_event()]
        keys = self.data_keys()
        offsets = offsets_at(events, at)
        if events[-1]["sample"] == at and "changes" in events[-1]:  # (an edit resumed here: its record stays)
            changes = {"changes": events[-1]["changes"]}
        else:
            changes = {}
        event = {"event": "blend", "sample": int(at), **changes,
                 "weights": {k: scaled[n] for k, n in zip(keys, names)},
                 "offsets": {**offsets, **{k: offsets.get(k, 0) for k in keys}},
                 "names": {**events[-1]["names"], **dict(zip(keys, names))}}
        self._set_blend(add(events, event))

    def _skip_position(self) -> dict:
        return {"sample": int(self.consumed)}

    def _skip_steps(self, steps, world_size) -> dict:
        """Training steps: global batches, on any world size (``world_size`` is the adapters' and means nothing
        here)."""
        a, b = step_range(steps, self.total_steps)
        if b - 1 > len(self):
            raise SkipError(f"steps {a}..{b - 1} run past the run's last step, {len(self)} (num_samples)")
        return {"steps": [a, b], "samples": [[(a - 1) * self.global_batch, (b - 1) * self.global_batch]]}

    def _skip_ids(self, ids) -> dict:
        """Global samples not yet served (``trace``'s ``sample``)."""
        arr = np.asarray(ids) if isinstance(ids, (list, tuple, range, np.ndarray, int, np.integer)) and \
            not isinstance(ids, bool) else None
        if arr is None or arr.dtype.kind not in "iu" or arr.size == 0:
            raise SkipError(f"ids must be a non-empty list of global samples (trace's 'sample'), got {str(ids)[:200]}")
        arr = arr.reshape(-1)
        if arr.dtype.kind == "u" and int(arr.max()) >= self.num_samples:
            raise SkipError(f"sample {int(arr.max())} is not a sample of this run (it has {self.num_samples})")
        arr = arr.astype(np.int64)
        if arr.min() < self.consumed or arr.max() >= self.num_samples:
            bad = int(arr.min()) if arr.min() < self.consumed else int(arr.max())
            raise SkipError(f"sample {bad} is not a sample the run has yet to serve (it stands at sample "
                            f"{self.consumed}; it has {self.num_samples}): roll back to a state before it")
        return {"ids": as_ranges(arr)}

    def _skip_where(self, where) -> dict:
        """``{"dataset": names, "documents": range(lo, hi)}``: the samples of those datasets, or of those holding
        any document of the range."""
        where_terms(where, LM_TERMS, "an LM run")
        out: dict = {}
        if "dataset" in where:
            out["dataset"] = name_list(where["dataset"], "dataset", self.dataset_names())
        if "documents" in where:
            if "dataset" not in out and len(self.sources) > 1:
                raise SkipError("where['documents'] names documents of one dataset: give where['dataset'] too")
            out["documents"] = range_arg(where["documents"], "where['documents']")
        return out

    def _refuse_skipping_everything(self, event: dict) -> None:
        out = event["where"]
        if "documents" not in out and set(out.get("dataset", self.dataset_names())) >= set(self.dataset_names()):
            raise SkipError(f"where={out}: this skips every dataset of the blend, leaving nothing to serve")

    def _skips_changed(self) -> None:
        self._ledger_cache = None

    def batch_for_step(self, step: int, state: dict | None = None, rank: int | None = None,
                       world_size: int | None = None) -> dict:
        """The batch rank ``rank`` of ``world_size`` (default: this iterator's) received at training step
        ``step``, rebuilt exactly from the run's latest ``state`` (default: this iterator's own): its blend and
        skips, without serving the steps before it."""
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= len(self):
            raise UsageError(f"step must be an integer in [1, {len(self)}] (the run's global batches), got {step!r}")
        world = self.world_size if world_size is None else int(world_size)
        rank = self.rank if rank is None else rank
        if world < 1 or self.global_batch % world:
            raise UsageError(f"world_size {world} must divide global_batch {self.global_batch}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
            raise UsageError(f"rank must be an integer in [0, {world}), got {rank!r}")
        if state is None:
            probe = copy.copy(self)  # (this iterator left as it was)
            probe.record = copy.deepcopy(self.record)
        else:
            probe = self._run_for_step(state, step)
        probe._plans, probe._ahead = {}, None
        probe.row_blocks = ((rank,), world)
        return probe._batch(step - 1, (step - 1, 0))

    # ----------------------------------------------------------------------------------------- trace
    def _trace(self, step: int, state: dict | None) -> list[dict]:
        """An LM step is one global batch: its rows, where each came from (:meth:`describe_ids`), the rank that
        holds it; ``state``'s history gives the blend of every step (weight changes, edits)."""
        if state is not None:
            return self._run_for_step(state, step).trace(step)
        if step > len(self):
            raise UsageError(f"step {step} is past the run's end: it is {len(self)} global batches (num_samples)")
        first = (step - 1) * self.global_batch
        per_rank = self.global_batch // self.world_size
        g = np.arange(first, first + self.global_batch)
        rows = self.describe_ids(g)
        dropped = self.skips.dropped_samples(g, self._where).tolist() if self.skips else [False] * len(g)
        return [{"step": step, "batch": step - 1, "rank": i // per_rank, "row": i % per_rank, **r,
                 "skipped": bool(x)} for i, (r, x) in enumerate(zip(rows, dropped))]

    def _run_for_step(self, state: dict, step: int):
        """The run of ``state`` as this config reads it (:meth:`run_of`), or, where step ``step`` drew from a
        dataset an edit has removed since, as the config in force then reads it (the state's config with the
        edits after the step undone)."""
        probe = self.run_of(state)
        g = np.arange((step - 1) * self.global_batch, step * self.global_batch)
        if not 1 <= step <= len(probe) or not (probe.dataset_index[g] < 0).any():
            return probe

        full = upgrade(find_state(state, "state"))
        edits = self.record.read(full).edits
        changed = all(isinstance((e.get("changes") or {}).get("data_path", [None])[0], str) for e in edits)
        if not isinstance(full.get("config"), dict) or not edits or not changed:
            return probe  # (it refuses the step, naming the dataset)
        m = len([e for e in edits if e["step"] < step])
        with reusing(self.datasets()):
            then = self.build_another(ml_collections.ConfigDict(configs_of(full["config"], edits)[m]), rank=self.rank,
                                  world_size=self.world_size)
        return then.run_of(full)

    # ----------------------------------------------------------------------------------------- ledger
    def ledger_totals(self, consumed: int | None = None) -> np.ndarray:
        """``int64[3, datasets]``: samples, tokens (their rows' real input tokens) and completed passes (epochs of
        the dataset's split) taken by every rank together up to global batch ``consumed`` (default: here). Samples
        and tokens are those served; samples the run's skips dropped are counted apart (:meth:`skipped_totals`),
        passes count them (the dataset moved past them)."""
        return self._count(consumed)[0]

    def skipped_totals(self, consumed: int | None = None) -> np.ndarray | None:
        """``int64[2, datasets]``: samples and tokens the run's skips dropped (never served) up to global batch
        ``consumed`` (default: here); None when the run made no skip."""
        return self._count(consumed)[1] if self.skips.events else None

    def _count(self, consumed: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(served totals as :meth:`ledger_totals` gives them, skipped samples and tokens) up to ``consumed``."""
        n = (self.consumed if consumed is None else int(consumed) * self.global_batch)
        cache = getattr(self, "_ledger_cache", None)
        if cache is None or cache[0] > n:
            cache = (0, np.zeros((3, len(self.sources)), np.int64), np.zeros((2, len(self.sources)), np.int64))
        done, totals, skipped = cache[0], cache[1].copy(), cache[2].copy()
        step = 1 << 16
        for lo in range(done, n, step):  # tokens count sample by sample: in blocks, remembered
            g = np.arange(lo, min(lo + step, n))
            which, k_in = self.dataset_index[g].astype(np.int64), self.dataset_sample[g]
            drop = self.skips.dropped_samples(g, self._where) if self.skips else np.zeros(len(g), bool)
            keep = which >= 0  # (a dataset an edit removed: not among this config's, not counted here)
            which, k_in, drop = which[keep], k_in[keep], drop[keep]
            totals[0] += np.bincount(which, minlength=len(self.sources))  # (drawn: the passes count them)
            skipped[0] += np.bincount(which[drop], minlength=len(self.sources))
            for d in np.unique(which).tolist():
                src = self.sources[d]
                mine = which == d
                epochs, samples = src.locate(k_in[mine])
                gone = drop[mine]
                for e in np.unique(epochs).tolist():
                    real = self._real_tokens(*src.pieces(e, samples[epochs == e], self.seq_len + 1))
                    totals[1, d] += int(real.sum())
                    skipped[1, d] += int(real[gone[epochs == e]].sum())
        self._ledger_cache = (n, totals.copy(), skipped.copy())
        out = totals.copy()
        out[2] = self.passes(totals[0])
        out[:2] -= skipped
        return out, skipped

    def _real_tokens(self, count: np.ndarray, pieces: dict) -> np.ndarray:
        """Per sample of ``LMSource.pieces``' answer: its real input tokens (the ``tokens`` positions of its row
        that hold data)."""
        per = np.bincount(np.repeat(np.arange(len(count)), count), weights=pieces["length"], minlength=len(count))
        return np.minimum(per, self.seq_len).astype(np.int64)

    def passes(self, samples) -> np.ndarray:
        """Per blended dataset: the passes over its split that its first ``samples[d]`` samples complete (the
        epochs its next sample lies beyond)."""
        return np.array([int(src.locate(np.array([int(n)]))[0][0]) - 1 if n else 0
                         for src, n in zip(self.sources, samples)], np.int64)

    def ledger_at(self) -> int:
        """Where :meth:`ledger` counts to: the global batches consumed."""
        return self.consumed // self.global_batch

    def _ledger(self, prefix: str, consumed: int) -> dict:
        """Per blended dataset ``samples``, ``tokens``, ``passes`` (and ``skipped`` ones) up to global batch
        ``consumed``; a dataset an edit removed, its samples."""
        totals = self.ledger_totals(consumed)
        out: dict = {}
        for d, name in enumerate(self.dataset_names()):
            out[f"{prefix}/{name}/samples"] = int(totals[0, d])
            out[f"{prefix}/{name}/tokens"] = int(totals[1, d])
            out[f"{prefix}/{name}/passes"] = int(totals[2, d])
        removed = [0, 0]
        if self.record.weights.blend:  # datasets an edit removed: their counts where the edit left them
            n = int(consumed) * self.global_batch
            keys = set(self.data_keys())
            names = {}
            for e in self.record.weights.blend:
                names.update(e["names"])
            dormant = self.record.ledger.dormant
            for key, taken in offsets_at(self.record.weights.blend, n).items():
                name = names.get(key, key)
                if key in keys or not taken:
                    continue
                kept = dormant.get(name, {"samples": int(taken)})
                for f in ("samples", "tokens", "passes"):
                    if f in kept:
                        out[f"{prefix}/{name}/{f}"] = int(kept[f])
                removed[0] += int(kept["samples"])
                removed[1] += int(kept.get("tokens", 0))
        out[f"{prefix}/samples"] = int(totals[0].sum()) + removed[0]
        out[f"{prefix}/tokens"] = int(totals[1].sum()) + removed[1]
        skipped = self.skipped_totals(consumed)
        if skipped is not None:
            for d, name in enumerate(self.dataset_names()):
                out[f"{prefix}/{name}/skipped"] = int(skipped[0, d])
                out[f"{prefix}/{name}/skipped_tokens"] = int(skipped[1, d])
            out[f"{prefix}/skipped"] = int(skipped[0].sum())
        out[f"{prefix}/step"] = int(consumed)
        return out

