"""Mixture edits: a run resumed with an edited config goes on where every stream stood, from the next step.

Every stream (a task's corpus) is a sequence with a position: the epoch's draw of the corpus (stratified and
concat samplers) or an endless stream (``mixing.sampler="stream"``). So a mixture can change without losing or
repeating a sample: streams on both sides continue from their positions, a new stream starts at its beginning, a
removed one keeps its position in the state (re-added later, it goes on from there). The planning window in
progress is left where the run stands: its rows not yet served go back to their streams, which read them again
first (``babelfeed.plan.parts``). What must not change is each kept stream's data (its files, hence its sequence),
the seed, the sampler and the shard scheme; everything else is a mixture setting (task weights, temperature,
method, schedule, filters, batching, prefixes, noise). fairseq-compatible sampling fixes its epochs as fairseq
does and refuses edits.

The state carries the config it was made with, so ``set_state(state, mixture_change="allow")`` on an iterator of
the edited config rebuilds the saved run and continues from it (``BatchIterator.continue_from``). The edit is
recorded in the state's history (step, epoch, global batch, and which config values changed) and said: an
:class:`EditReport`, printed once (a :class:`~babelfeed.errors.Notice`) and kept as the iterator's ``last_edit``.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field

import ml_collections
import numpy as np

from babelfeed.errors import (ConfigTypeError, HistoryError, Notice, StateError, StateMismatch, UnknownConfigKey,
                              UsageError, UsageTypeError, user_frame)
from babelfeed.plan.totals import FIELDS
from babelfeed.sources.sources import data_digest


class Edits:
    """A run's mixture edits, in the order made: a component of the run record. Each is ``{"step", "epoch",
    "batch", "changes"}`` (the step after which it took effect, where the edited plan began, what changed), with
    ``saved``: the weight changes and update counts of the segment before it (a translation run's, so that trace
    can plan that segment again). Edits of babelfeed 0.1 have its own shape (``saved_at_step``: the saved window
    was finished first); they are kept and read as they are."""

    def __init__(self, events=()):
        self.events: list = [dict(e) for e in events]

    def get_state(self) -> list:
        return [dict(e) for e in self.events]

    def set_state(self, edits: list, total: int | None = None, at: tuple | None = None) -> None:
        self.check(edits, total, at)
        self.events = [dict(e) for e in edits]

    @staticmethod
    def check(edits: list, total: int | None = None, at: tuple | None = None) -> None:
        """Refuse edits that lie past the state's own position: step ``total`` at ``at`` (epoch, global batch)."""
        late = [e for e in edits if (total is not None and e.get("saved_at_step", e["step"]) > total)
                or (at is not None and (e["epoch"], e.get("batch", 0)) > tuple(at))]
        if late:
            raise HistoryError(f"iterator state field 'history': an 'edit' event made at step "
                               f"{late[0].get('saved_at_step', late[0]['step'])} (epoch {late[0]['epoch']}) lies past "
                               f"the state's own position (step {total}, at {tuple(at) if at else '?'})")

    def add(self, event: dict) -> None:
        self.events.append(dict(event))

    def __len__(self) -> int:
        return len(self.events)

    def timeline(self) -> list[dict]:
        """Per edit, what a report shows: the first step it served, where, and what changed."""
        return [{"edit": i + 1, "from_step": int(e["step"]) + 1, "epoch": int(e["epoch"]),
                 "batch": int(e.get("batch", e.get("global_batch", 0))),
                 "changes": {k: v for k, v in e.get("changes", {}).items() if k != "data.path"}}
                for i, e in enumerate(self.events)]


def snapshot(config) -> dict:
    """A translation config as plain JSON (what a state carries to rebuild the run's plan)."""
    return json.loads(json.dumps(config.to_dict(), default=list))


def stream_identities(planner) -> dict:
    """Per stream name: what its sequence depends on (its corpus, each shard's size and content hashes).
    Cached on the planner."""
    if getattr(planner, "_identities", None) is not None:
        return planner._identities
    specs = {s.name: s for s in planner.sources.streams}
    out: dict = {}
    for c in planner.sources.components:
        out.setdefault(c.key, [specs[c.key].key, specs[c.key].text])
        out[c.key].append([int(c.shard), len(c), data_digest(c.src), data_digest(c.tgt)])
    planner._identities = {k: hashlib.sha256(json.dumps(v, default=str).encode()).hexdigest()[:16]
                           for k, v in out.items()}
    return planner._identities


def edited_config(it, config, changes: dict):
    """The config an edit of iterator ``it`` goes on with: ``config`` (a whole config, a dict of changes, or None:
    ``it``'s own) with ``changes`` applied (``"mixing.temperature"`` or ``mixing__temperature`` keys)."""
    snap = getattr(it, "config_snapshot", None)
    if config is not None and not isinstance(config, dict):  # (a ConfigDict is not a dict: said apart)
        if not isinstance(config, ml_collections.ConfigDict):
            hint = (f" (a config's name or file: babelfeed.load_config({config!r}) gives the config)"
                    if isinstance(config, str) else "")
            raise UsageTypeError(f"edit takes the edited config (an ml_collections.ConfigDict of the same data), a "
                                 f"dict of changes or keyword changes (mixing__temperature=2.0); got "
                                 f"{type(config).__name__}{hint}")
    if isinstance(config, dict) and not isinstance(config, ml_collections.ConfigDict) and "data" not in config \
            and "data_path" not in config:
        changes, config = {**config, **changes}, None  # a dict of changes
    changes = _dotted(changes)
    if config is None:
        if snap is None:
            raise UsageError("edit: this iterator was not built from a config; give the edited config")
        config = ml_collections.ConfigDict(json.loads(json.dumps(snap)))
    else:
        config = ml_collections.ConfigDict(config.to_dict() if hasattr(config, "to_dict") else dict(config))
    if not changes and snap is not None and snapshot(config) == snap:
        raise UsageError("edit: give the edited config or the changes to make")
    for dotted, value in changes.items():
        path = dotted.replace("__", ".").split(".")
        node = config
        for k in path[:-1]:
            if k not in node:
                raise UnknownConfigKey(f"edit: {dotted!r} is not a key of the run's config (no {k!r})")
            node = node[k]
        if path[-1] not in node and path[0] != "tasks":
            raise UnknownConfigKey(f"edit: {dotted!r} is not a key of the run's config")
        try:
            node[path[-1]] = value
        except (TypeError, ValueError):
            raise ConfigTypeError(f"edit: {dotted.replace('__', '.')} takes a {type(node[path[-1]]).__name__} (it is "
                                  f"{node[path[-1]]!r}), got {value!r}") from None
    return config


def _dotted(changes: dict) -> dict:
    """Changes with a section given as a dict (``{"mixing": {"temperature": 2.0}}``, ``mixing={...}``) as the
    keys it sets (``mixing.temperature``): a section is edited key by key, never replaced whole. (A task entry,
    ``tasks.NAME``, is one value.)"""
    out = {}
    for k, v in changes.items():
        key = k.replace("__", ".")
        if isinstance(v, dict) and not key.startswith("tasks."):
            for sub, value in _dotted(v).items():
                out[f"{key}.{sub}"] = value
        else:
            out[key] = v
    return out


def _flat(d, prefix="") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and not (prefix.startswith("tasks.") and prefix.count(".") >= 1):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def config_changes(old: dict, new: dict) -> dict:
    """``{dotted key: [old value, new value]}`` of what differs (a task added or removed: its whole entry)."""
    a, b = _flat(old), _flat(new)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def check_data(saved: dict, old_config: dict, new_planner) -> None:
    """Refuse an edit that changes data a kept stream reads (``saved``: the state's stream identities), or the
    seed (every stream's sequence)."""
    if not isinstance(saved, dict) or not all(isinstance(k, str) for k in saved):
        raise StateError(f"iterator state field 'data' must map stream names to what they read, got "
                         f"{str(saved)[:200]}")
    if not isinstance(old_config.get("data"), dict) or "seed" not in old_config:
        raise StateError("iterator state field 'config' is not a whole config of the run (its data section or seed "
                         "is missing): resume with the config it was saved with")
    seed = old_config.get("seed")
    if seed != new_planner.opts.seed:
        raise StateMismatch(f"the seed changed ({seed} -> {new_planner.opts.seed}): every stream's order would "
                            f"change, so no stream could go on where it stood; keep the seed")
    split = old_config.get("data", {}).get("train_split")
    if split != new_planner.sources.split:
        raise StateMismatch(f"the training split changed ({split} -> {new_planner.sources.split})")
    new = stream_identities(new_planner)
    changed = sorted(k for k in set(saved) & set(new) if saved[k] != new[k])
    if changed:
        raise StateMismatch(f"the data of stream(s) {changed[:5]} changed (another corpus, tokenizer or shard files "
                            f"under the same name): they cannot go on where they stood. Give changed data a new stream "
                            f"name (a task of its own) and keep the old name for the old data")


def map_totals(totals: np.ndarray, keys, new_keys, dormant: dict | None = None) -> np.ndarray:
    """Ledger totals of streams ``keys`` in the order of ``new_keys`` (a new stream: 0, or its dormant counts)."""
    index = {k: i for i, k in enumerate(keys)}
    out = np.zeros((len(FIELDS), len(new_keys)), np.int64)
    for j, k in enumerate(new_keys):
        if k in index:
            out[:, j] = totals[:, index[k]]
        elif dormant and k in dormant:
            out[:, j] = [dormant[k][f] for f in FIELDS]
    return out


# settings an edit cannot change: what a stream's positions mean (the sampler, the shards an epoch reads)
FIXED = {"mixing.sampler": "what a stream's position means (the epoch's draw of a corpus, or an endless stream)",
         "data.shards": "which rows an epoch reads (one shard of each corpus, or every shard)",
         "compat": "fairseq-compatible batches"}


def check_editable(old: dict, new: dict, planner, resolved: str | None = None) -> None:
    """Refuse an edit this run cannot make: fairseq-compatible sampling, or a change of a setting in
    :data:`FIXED` (a stream's position would mean something else on the other side). ``resolved``: the sampler
    the run's ``mixing.sampler`` resolved to, where known (otherwise a change to or from "auto" is left to
    :func:`check_sampler`, once both runs are built)."""
    why = planner.can_hand_off()
    if why:
        raise StateMismatch(f"this run cannot take a mixture edit: {why}")
    changed = config_changes(old, new)
    for key, what in FIXED.items():
        if key in changed:
            before, after = changed[key]
            if key == "mixing.sampler" and "auto" in (before, after) and (resolved is None
                                                                           or after in ("auto", resolved)):
                continue  # ("auto" resolves when the run is built: check_sampler compares what each resolved to)
            raise StateMismatch(f"an edit cannot change {key} ({before!r} -> {after!r}): it decides {what}, so no "
                                f"stream could go on where it stood. Keep {key}={before!r}, or start a new run")


def check_sampler(old_planner, new_planner) -> None:
    """Refuse an edit whose sampler resolves to another than the run's (``mixing.sampler="auto"`` on one side)."""
    before, after = old_planner.opts.sampler, new_planner.opts.sampler
    if before != after:
        raise StateMismatch(f"an edit cannot change mixing.sampler (the run's resolves to {before!r}, the edited "
                            f"config's to {after!r}): it decides {FIXED['mixing.sampler']}, so no stream could go on "
                            f"where it stood. Set mixing.sampler={before!r} in the edited config, or start a new run")


@dataclass
class EditReport:
    """What a mixture edit changed, said when it is accepted (and kept as the iterator's ``last_edit``).

    ``step``: the first training step (1-based) the edited mixture serves; ``epoch``, ``batch``: where it begins
    (its global batch of the epoch); ``changes``: ``{config key: [old, new]}``; ``shares``: per stream, its
    probability before and after (0 where absent); ``added``, ``removed``: streams; ``returned``: rows of the
    planning window in progress that were planned and not served, back in their streams."""

    step: int
    epoch: int
    batch: int
    changes: dict
    shares: dict = field(default_factory=dict)
    added: list = field(default_factory=list)
    removed: list = field(default_factory=list)
    returned: int = 0
    shapes: tuple = ()  # (static shapes that changed, of how many), where the run has static shapes

    @staticmethod
    def shares_of(it) -> dict:
        """Per stream, its probability where ``it`` stands (its epoch's, or the stream window's)."""
        planner = it.planner
        epoch = it.epoch
        try:
            setup = planner.setup(epoch)  # (no window planned: what the epoch's or the next window's mix is)
            probs = setup.probs
            if planner.sampler.streams:
                at = planner.since_start(epoch, it.consumed)
                probs = planner.probabilities(setup.directions, planner.update_at(at), batches=at)
        except (ValueError, IndexError):
            return {}
        return {k: float(p) for k, p in zip(planner.keys, np.asarray(probs, np.float64).tolist())}

    @classmethod
    def made(cls, it, before: dict, changes: dict, returned: int = 0, old_shapes=()) -> "EditReport":
        after = cls.shares_of(it)
        new_shapes = tuple(tuple(x) for x in getattr(it.planner.opts, "shapes", ()))
        old_shapes = tuple(tuple(x) for x in old_shapes)
        shapes = (len(set(new_shapes) - set(old_shapes)), len(new_shapes)) if new_shapes or old_shapes else ()
        streams = sorted(set(before) | set(after), key=lambda k: (-after.get(k, 0.0), k))
        return cls(step=int(it.total_steps) + 1, epoch=int(it.epoch), batch=int(it.consumed), changes=dict(changes),
                   shares={k: (before.get(k, 0.0), after.get(k, 0.0)) for k in streams},
                   added=sorted(set(after) - set(before)), removed=sorted(set(before) - set(after)),
                   returned=int(returned), shapes=shapes)

    def as_dict(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "batch": self.batch, "changes": self.changes,
                "shares": {k: list(v) for k, v in self.shares.items()}, "added": self.added,
                "removed": self.removed, "returned": self.returned, "new_shapes": list(self.shapes)}

    def table(self, limit: int = 12) -> str:
        """The edit as a few lines and a table of every stream's share before and after (the ``limit`` that
        changed most, above that many)."""
        lines = [f"mixture edit: from step {self.step} (epoch {self.epoch}, global batch {self.batch}) the run "
                 f"follows the edited config" + (f"; {self.returned:,} rows planned and not yet served went back to "
                                                  f"their streams" if self.returned else "")]
        for k, (old, new) in list(self.changes.items())[:8]:
            if k != "data.path":
                lines.append(f"  {k}: {json.dumps(old)} -> {json.dumps(new)}")
        if len(self.changes) > 8:
            lines.append(f"  ... and {len(self.changes) - 8} more changes")
        if self.shapes and self.shapes[0]:
            lines.append(f"  static shapes: {self.shapes[0]} of {self.shapes[1]} are new (chosen for the edited "
                         f"mixture): a jitted step compiles once for each")
        if self.added:
            lines.append(f"  streams added: {', '.join(self.added[:10])}" + (" ..." if len(self.added) > 10 else ""))
        if self.removed:
            lines.append(f"  streams removed: {', '.join(self.removed[:10])}" + (" ..." if len(self.removed) > 10
                                                                                else ""))
        rows = sorted(self.shares.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))
        shown = rows[:limit]
        width = max([len(k) for k, _ in shown] + [6])
        lines.append(f"  {'stream':<{width}}  share before  share after")
        for k, (a, b) in sorted(shown, key=lambda kv: -kv[1][1]):
            lines.append(f"  {k:<{width}}  {a:12.2%}  {b:11.2%}")
        if len(rows) > limit:
            lines.append(f"  ({len(rows) - limit} more streams changed less)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def say(self) -> None:
        """Print the edit once (a :class:`~babelfeed.errors.Notice`: ``warnings.filterwarnings("ignore",
        category=babelfeed.errors.Notice)`` silences it)."""
        warnings.warn(self.table(), Notice, stacklevel=user_frame())
