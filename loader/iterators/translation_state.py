"""A translation run's state: the record's envelope at a position, a resume from it, and an edited resume.

``get_state`` writes the run record (``run.record``) with what the plan goes on from: the ledger's counts when
the epoch began, every stream's position (stream sampler), an edited epoch's part (``plan.parts``) and the config
the run was built from. ``set_state`` reads it back, checked field by field; with ``mixture_change="allow"`` a
state of another config is the run so far, which :meth:`TranslationState.continue_from` goes on from under this
config (``run.edits``). Part of :class:`~babelfeed.iterators.translation.BatchIterator`.
"""

from __future__ import annotations

import warnings

import ml_collections
import numpy as np

from babelfeed.errors import HistoryError, Notice, SkipError, StateError, StateMismatch, user_frame
from babelfeed.iterators.protocol import MAX_EPOCHS_AHEAD
from babelfeed.iterators.ledger import FIELDS
from babelfeed.plan.parts import Part, decode, encode
from babelfeed.run.edits import (EditReport, check_data, check_editable, check_sampler, config_changes, map_totals,
                                 stream_identities)
from babelfeed.run.history import Views, check
from babelfeed.run.layout import Layout
from babelfeed.run.record import check_mixture_change, check_seal, no_strict, seal
from babelfeed.run.skips import Skips
from babelfeed.sources.corpus import reusing


class TranslationState:
    """The translation iterator's state and resume (see the module)."""

    def get_state(self) -> dict:
        """A small JSON-serialisable dict; the same on every rank at the same step: the record's envelope
        (``run.record``) at this position, with the ledger's counts when the epoch began, and what the plan goes
        on from (stream positions, an edited epoch's part, the config the run was built from)."""
        c = self.consumed
        epoch = self.epoch
        if self.planner.locate(epoch, c, self._hint) is None and c > 0:
            epoch, c = epoch + 1, 0  # finished epoch: resume at the start of the next
        planner = self.planner
        fields = self.record.ledger.get_state(epoch, planner.keys, self.ledger_start(epoch),
                                              self.skipped_start(epoch) if self.skips else None)
        if planner.sampler.streams:  # where every stream stood when this epoch began, by name: an edit maps them
            positions, batches = planner.epoch_start(epoch)
            fields["stream"] = {"positions": positions.tolist(), "batches": int(batches), "keys": list(planner.keys)}
            served = planner.served_by_key(epoch)
            if served:  # rows an edit left served ahead of their streams' positions (plan.parts)
                fields["served"] = {k: encode(v) for k, v in served.items()}
        part = planner.part
        if part is not None and part.epoch == epoch:  # an edited epoch: where its part began (plan.parts)
            fields["part"] = part.to_state()
        if self.record.layout is not None:  # ids and stream numbers an edit kept (run.layout)
            fields["layout"] = self.record.layout.get_state()
        if self.config_snapshot is not None:  # what an edit compares and, from the edits, every earlier config
            fields["config"] = self.config_snapshot
            fields["data"] = stream_identities(planner)  # per stream: what its sequence reads
        out = self.record.envelope({"epoch": epoch, "consumed": c, "total_steps": self.total_steps},
                                   planner.fingerprint(), planner.identity(), fields)
        out["seal"] = seal(out)
        return out

    STATE_FIELDS = ("stream", "ledger", "config", "dormant", "history", "skipped", "data", "part", "served", "layout",
                    "seal", "ledger_from")

    def _check_extra(self, state: dict):
        """The optional fields of a state: well formed, or an error naming the field. Returns the history's
        views (``babelfeed.run.history``)."""
        self.record.ledger.check(state)
        if "history" not in state:
            self._check_edit_fields(state, [])
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
        self._check_edit_fields(state, views.edits)
        return views

    @staticmethod
    def _check_edit_fields(state: dict, edits: list) -> None:
        """The fields an edited run's state carries, present together with its edit events: a state with an
        edit's fields and no edit, or an edit without them, was damaged or edited by hand (it would resume into
        other batches, or renumber samples)."""
        has = [f for f in ("part", "dormant") if f in state]
        if has and not edits:
            raise StateError(f"iterator state field {has[0]!r} belongs to a run a mixture edit changed, but the "
                             f"state's history records no edit (damaged, or edited by hand): resume from a state "
                             f"saved by babelfeed")
        if not edits:
            return
        missing = [f for f in ("config",) + (("layout",) if "dormant" in state else ()) if f not in state]
        last = edits[-1]
        if last.get("epoch") == state.get("epoch") and last.get("batch", 0) > 0 and "part" not in state:
            missing.append("part")
        if missing:
            raise StateError(f"iterator state lacks {missing}, which the state of a run a mixture edit changed "
                             f"carries (its history holds an edit at epoch {last.get('epoch')}, global batch "
                             f"{last.get('batch', 0)}): damaged, or edited by hand; resume from a state saved by "
                             f"babelfeed")

    def set_state(self, state: dict, mixture_change: str = "refuse", *, strict=None) -> None:
        """Continue after ``state`` (from ``get_state()``). A state of another config: ``mixture_change``
        (``protocol.MIXTURE_CHANGES``) says what to do. ``"allow"``: the config was edited (weights, temperature,
        corpora or tasks added or removed, batching...): every stream goes on from its position from the next
        step, the rows the planning window in progress had not served back in their streams
        (``babelfeed.run.edits``); a change to a kept stream's data, the seed, the sampler or the shard
        scheme is refused. ``"keep_position"``: this config's plan from the state's epoch and global batch, said
        out loud (samples may repeat or be skipped)."""
        no_strict(strict)
        check_mixture_change(mixture_change)
        strict = mixture_change != "keep_position"
        state = self._state_in(state)
        stream = self.planner.sampler.streams
        self._refuse_a_stream_state(state, "resume with the run's config")
        if (mixture_change == "allow" and isinstance(state, dict)
                and state.get("fingerprint") not in self.fingerprints()):
            return self._resume_edited(state)
        if mixture_change == "refuse" and self._weights_set_since(state):
            return self._resume_with_its_weights(state)
        self._check_state(state, strict, {"epoch": 1, "consumed": 0, "total_steps": 0},
                          optional=self.STATE_FIELDS)
        history = self._check_extra(state)
        if stream and "stream" in state:
            self._check_stream(state["stream"], self.planner.keys)
        elif stream and strict:
            raise StateError("iterator state lacks 'stream' (where each stream stood when the epoch began), which "
                             "get_state() writes for mixing.sampler='stream'")
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        if epoch >= 1 << 31:
            raise StateError(f"iterator state field 'epoch' must be below 2**31 (epochs seed the shuffles), got {epoch}")
        self._check_epoch_reached(state, epoch)
        planner = self.planner
        self.record.weights.set_state(history, planner, planner.opts.batches_per_update)
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
            raise StateError(f"iterator state consumed={consumed} is past the end of epoch {epoch}, which has "
                             f"{self.planner.num_batches(epoch)} global batches")
        if not history.edits:  # (an edited run's earlier epochs were another config's: their sizes are not known)
            self._check_steps_possible(state, epoch, consumed)
        check_seal(state)  # (after the checks that name what is wrong more precisely)
        self.record.ledger.set_state(state, epoch, list(planner.keys))  # (no ledger: counted from the plans)

        self.use_layout(Layout.from_state(state["layout"], planner) if "layout" in state else None)
        self.record.edits.set_state(history.edits)
        self.record.skips.set_state(history.skips)
        self._fillers = {}
        self.epoch = epoch
        self._base = consumed
        self.step = 0
        self._hint = (0, 0)
        self._ra_hint = {}
        self.total_steps = int(state["total_steps"])
        self.record.steps.resume(history.steps, history.splits, self.total_steps, epoch, consumed)
        if "ledger" not in state and epoch > 1:
            self._ledger_of_an_older_state(epoch)
        if not strict:
            self._say_kept_position(state)

    def _check_part(self, state: dict, epoch: int, consumed: int):
        """The state's ``part`` (an edited epoch: where the edit began it), checked against its position and this
        config's sampler; None where it has none."""
        if "part" not in state:
            return None

        part = Part.from_state(state["part"])
        if part.epoch != epoch or part.batch > consumed:
            raise StateError(f"iterator state field 'part' begins at epoch {part.epoch}, global batch {part.batch}; "
                             f"the state stands at epoch {epoch}, global batch {consumed}: a part holds the state's "
                             f"own epoch from before its position (edited or damaged)")
        if bool(part.base) == bool(self.planner.sampler.streams):
            raise StateError(f"iterator state field 'part' was written by a run with "
                             f"{'another sampler than' if part.base else ''} mixing.sampler="
                             f"{self.planner.opts.sampler!r}: resume with the run's config")
        return part

    def _check_served(self, served) -> dict:
        """The state's ``served`` (rows an edit left served ahead of their streams), by stream index."""
        index = {k: i for i, k in enumerate(self.planner.keys)}
        if not isinstance(served, dict):
            raise StateError(f"iterator state field 'served' must map streams to served positions, got "
                             f"{str(served)[:200]}")
        out = {}
        for k, v in served.items():
            if k not in index or not isinstance(v, str):
                raise StateError(f"iterator state field 'served' names {k!r}, not a stream of this config, or holds "
                                 f"no positions")
            try:
                out[index[k]] = decode(v)
            except ValueError:
                raise StateError(f"iterator state field served[{k!r}] is not a set of positions (edited or "
                                 f"damaged)") from None
        return out

    def _refuse_a_stream_state(self, state, then: str) -> None:
        """Refuse a state of the stream sampler (where every stream stands) when this config's is another."""
        if not self.planner.sampler.streams and isinstance(state, dict) and {"stream", "served"} & set(state):
            raise StateMismatch(f"this state was saved with mixing.sampler='stream' (it holds where every stream stands); "
                                f"this config's sampler is {self.planner.opts.sampler!r}: {then}")

    @staticmethod
    def _check_epoch_reached(state: dict, epoch: int) -> None:
        """Refuse an epoch the state's own counts say the run never reached: every epoch before it took at least
        one step and one sample (a hand-edited ``epoch``: it would be accepted, or, without a ledger, counted for
        hours)."""
        total = int(state["total_steps"])
        if total < epoch - 1:
            raise StateError(f"iterator state says epoch {epoch} after {total} training steps, but every epoch takes "
                             f"at least one step: the state was edited or is damaged (total_steps, epoch)")
        ledger = state.get("ledger")
        since = state.get("ledger_from", 1)  # a ledger counted from that epoch on (an older state resumed far on)
        if isinstance(ledger, dict) and isinstance(ledger.get("samples"), dict) and type(since) is int:
            served = sum(v for v in ledger["samples"].values() if isinstance(v, int) and not isinstance(v, bool))
            if served < epoch - since:
                raise StateError(f"iterator state says epoch {epoch}, but its ledger counts {served} samples served "
                                 f"before it, and every epoch serves at least one: the state was edited or is damaged")

    def _ledger_of_an_older_state(self, epoch: int) -> None:
        """A state without a ledger (an older babelfeed's): the ledger's counts when ``epoch`` began come from every
        earlier epoch's plan, counted now, with a progress bar (not at the first ``get_state``, in training); more
        than ``MAX_EPOCHS_AHEAD`` epochs would take hours: the ledger then counts from ``epoch`` on, said once."""
        if epoch - 1 <= MAX_EPOCHS_AHEAD:
            self.ledger_start(epoch)
            self.skipped_start(epoch)
            return
        zeros = np.zeros((len(FIELDS), len(self.planner.keys)), np.int64)
        self.record.ledger.start = {epoch: zeros}
        self.record.ledger.skipped = {epoch: zeros.copy()}
        self.record.ledger.counts_from = epoch  # kept in the states it writes ('ledger_from')
        warnings.warn(f"this state holds no ledger (an older babelfeed's) and is at epoch {epoch:,}: counting one would "
                      f"plan every earlier epoch, more than {MAX_EPOCHS_AHEAD:,}; the ledger counts from epoch "
                      f"{epoch:,} on (what earlier epochs served is not in it)", Notice, stacklevel=user_frame())

    def _check_steps_possible(self, state: dict, epoch: int, consumed: int) -> None:
        """Refuse more steps than global batches the run can have served: a step takes one at least, so at most
        this epoch's ``consumed`` plus every sample of each earlier epoch (twice the largest of epoch 1 and this
        one: shards and schedules change an epoch's size, never by that much). What resume plans anyway."""
        total = int(state["total_steps"])
        if total <= consumed:
            return
        biggest = max(max(x.total, x.samples) for x in (self.planner.setup(1), self.planner.setup(epoch)))
        most = consumed + (epoch - 1) * 2 * biggest
        if biggest and total > most:
            raise StateError(f"iterator state says {total:,} training steps by epoch {epoch}, global batch {consumed}, "
                             f"but a step takes a global batch at least and the run can have served {most:,} at most "
                             f"(epochs of {biggest:,} samples or fewer): the state was edited or is damaged "
                             f"(total_steps)")

    def _resume_edited(self, state: dict) -> None:
        """set_state with mixture_change="allow" for a state of another config (``babelfeed.run.edits``):
        the saved run is rebuilt from the config the state carries, and this run goes on from where it stood."""
        self._check_state(state, False, {"epoch": 1, "consumed": 0, "total_steps": 0}, optional=self.STATE_FIELDS)
        self._check_extra(state)
        self._check_epoch_reached(state, int(state["epoch"]))
        check_seal(state)
        snap = state.get("config")
        if not isinstance(snap, dict):
            raise StateError("this state carries no config of its run (saved by an older babelfeed, or by an "
                             "iterator not built from a config): resume with the config it was saved with, then "
                             "edit at a later state")
        data = state.get("data") if "data" in state else (state.get("stream") or {}).get("data")
        check_data(data or {}, snap, self.planner)
        check_editable(snap, self.config_snapshot or {}, self.planner)  # (before the saved run is rebuilt)
        old_cfg = ml_collections.ConfigDict(snap)
        if self.config_snapshot is not None:
            old_cfg.data.path = self.config_snapshot["data"]["path"]  # the data as this run finds it
        with reusing(self.datasets(), self.dictionaries()):  # (the data this run has open: the saved run's, mostly)
            old = self.build_another(old_cfg, rank=self.rank, world_size=self.world_size, split=self.split)
        check_sampler(old.planner, self.planner)
        try:
            old.set_state(state)  # the saved config reproduces the saved run
        except ValueError as e:
            raise StateMismatch(f"the config this state was saved with does not reproduce its run on the data at "
                                f"{old_cfg.data.path} (a stream the edit removed reads other data now?): {e}") from None
        self.continue_from(old)

    WEIGHT_KEYS = ("mixing.schedule.weights", "mixing.schedule.boundaries")

    def _weights_set_since(self, state) -> bool:
        """Whether ``state`` is this config's run with task weights set since (``set_weights`` on a sampler where
        it is an edit of ``mixing.schedule.weights``): its config differs from this one in those alone."""
        if not isinstance(state, dict) or state.get("fingerprint") in self.fingerprints() or \
                not isinstance(state.get("config"), dict) or self.config_snapshot is None:
            return False
        changes = {k for k in config_changes(state["config"], self.config_snapshot) if k != "data.path"}
        edits = [e for e in state.get("history", []) if isinstance(e, dict) and e.get("event") == "edit"]
        return bool(changes) and changes <= set(self.WEIGHT_KEYS) and any(
            isinstance(e.get("changes"), dict) and set(e["changes"]) <= set(self.WEIGHT_KEYS) for e in edits)

    def _resume_with_its_weights(self, state) -> None:
        """A run of this config whose weights ``set_weights`` set: resumed with them (the config the state carries,
        on this run's data), as if it had never stopped."""
        config = ml_collections.ConfigDict(state["config"])
        config.data.path = self.config_snapshot["data"]["path"]
        with reusing(self.datasets(), self.dictionaries()):
            it = self.build_another(config, rank=self.rank, world_size=self.world_size, split=self.split)
        it.set_state(state)
        self._become(it)

    def take_edit(self, old):
        """:meth:`edit`'s second half: go on with this iterator's config from ``old`` (the run, in this process),
        once the edit is checked as a resume checks it."""
        check_data(stream_identities(old.planner), old.config_snapshot or {}, self.planner)
        check_editable(old.config_snapshot or {}, self.config_snapshot or {}, self.planner)
        return self.continue_from(old)

    def continue_from(self, old, quiet: bool = False):
        """Go on with this iterator's config where ``old`` (an iterator of the run so far, another config of the
        same data) stands: from its next step, every stream from its position, the rows of the planning window in
        progress that were not served back in their streams (``babelfeed.plan.parts``). The ledger, skips, world
        sizes and history go on; the edit is recorded in the history and said (an ``EditReport``, also kept as
        ``last_edit``; ``quiet``: not said, as when trace replays a run's edits)."""
        planner, P = self.planner, old.planner
        epoch, consumed = old.epoch, old.consumed
        if consumed and P.locate(epoch, consumed) is None:  # (the epoch is over: the edit begins the next one)
            epoch, consumed = epoch + 1, 0
        history = old.skips.events
        pending = [b for e in history if "steps" in e for b in e["batches"] if b[0] > epoch]
        if pending:
            raise SkipError(f"this run skips global batches {pending[0][1]}..{pending[0][2] - 1} of epoch "
                            f"{pending[0][0]}, an epoch it has not reached yet, and an edit changes how many batches "
                            f"the epochs before it hold (other steps): resume with its own config, or skip those "
                            f"samples by id (it.skip(ids=...), the ids trace names) after the edit")
        before = EditReport.shares_of(old)
        part = P.handoff(old.epoch, old.consumed)
        keys, old_keys = list(planner.keys), list(P.keys)
        for k, kept in old.record.ledger.dormant.items():  # streams an earlier edit removed, added back: where they stood
            if k in keys and not planner.sampler.streams and kept.get("epoch") == part.epoch:
                raise StateMismatch(
                    f"stream {k} was removed by an edit earlier in epoch {part.epoch}: with mixing.sampler="
                    f"{planner.opts.sampler!r} a stream's draw for an epoch is made when the epoch begins, and adding "
                    f"it back in the same epoch would serve rows of that draw again. Add it back from epoch "
                    f"{part.epoch + 1} (an edit between two passes of a loader, or at the epoch's first step), or "
                    f"run with mixing.sampler='stream', whose streams go on where they stood")
            if k in keys and k not in part.positions and "position" in kept and planner.sampler.streams:
                part.positions[k] = int(kept["position"])
                if kept.get("served"):
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
        for name, kept in old.record.ledger.dormant.items():
            counts.setdefault(name, {f: int(kept[f]) for f in FIELDS})
        self.record.ledger.start = {first[0]: map_totals(np.zeros((3, 0), np.int64), [], keys, counts)}
        dormant = {}
        for k in set(old_keys) | set(old.record.ledger.dormant):
            if k in keys:
                continue
            was = old.record.ledger.dormant.get(k, {})
            entry = {**{f: counts[k][f] for f in FIELDS}, "rows": int(rows.get(k, was.get("rows", 0)))}
            if not planner.sampler.streams:  # the epoch it was removed in (not added back in the same epoch)
                entry["epoch"] = int(was.get("epoch", part.epoch))
            if planner.sampler.streams:
                entry["position"] = int(part.positions.get(k, was.get("position", 0)))
                served = part.served.get(k)
                if served is not None and len(served):
                    entry["served"] = encode(served)
                elif was.get("served"):
                    entry["served"] = was["served"]
            dormant[k] = entry
        self.record.ledger.dormant = dormant
        others = {k: list(v) for k, v in old.record.ledger.skipped_other.items()}
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
        self.record.ledger.skipped, self.record.ledger.skipped_other = {first[0]: start}, others
        self.skips = Skips(old.skips.events)
        self._fillers = {}
        self.total_steps = int(old.total_steps)
        self.record.steps.resume(old.record.steps.steps(), old.record.steps.splits(), self.total_steps, *first)
        changes = config_changes(old.config_snapshot or {}, self.config_snapshot or {})
        event = {"step": int(self.total_steps), "epoch": int(first[0]), "batch": int(first[1]),
                 "changes": changes, "saved": {"weights": [[b, dict(zip(P.sources.tasks, w.tolist()))]
                                                           for b, w in P.weight_changes],
                                               "updates": [list(u) for u in P.update_segments]
                                               if P.sampler.streams and P.changing_schedule else []}}
        self.record.edits.events = list(old.record.edits.events) + [event]

        self.use_layout((old.record.layout or Layout.plain(P)).extended(planner))
        self.epoch, self._base, self.step = first[0], first[1], 0
        self._hint, self._ra_hint = (0, 0), {}
        self.last_edit = EditReport.made(self, before, changes, part.returned, P.opts.shapes)
        if not quiet:
            self.last_edit.say()
        return self.last_edit

    def _check_stream(self, stream, keys=None) -> None:
        if isinstance(stream, dict) and "keys" in stream and keys is not None and stream["keys"] != list(keys):
            raise StateError(f"iterator state field stream['keys'] names the streams {str(stream['keys'])[:200]}, "
                             f"this config's are {str(list(keys))[:200]}: an edited mixture resumes with "
                             f"set_state(state, mixture_change='allow')")
        ok = (isinstance(stream, dict) and set(stream) - {"keys"} == {"positions", "batches"}
              and isinstance(stream["positions"], list) and isinstance(stream["batches"], int)
              and not isinstance(stream["batches"], bool) and stream["batches"] >= 0
              and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in stream["positions"]))
        if not ok:
            raise StateError(f"iterator state field 'stream' must be {{'positions': [integers >= 0], 'batches': "
                             f"integer >= 0}}, got {stream!r}"[:300])
