"""The run record: one object that composes a run's components into its saved state, and reads them back.

A state is an envelope, the same for every kind of run::

    {"version", "kind", "name", <position>, "fingerprint", "identity", "history", <the components' fields>}

``kind`` is "translation" or "lm" (always written; older states get it from ``history.upgrade``); the position is
the iterator's own (``epoch``, ``consumed``, ``total_steps``; an LM run's ``consumed_samples``); ``fingerprint``
names the data and every setting that shapes the batches, ``identity`` what it stands for (so a mismatch can say
what changed); ``history`` is every component's events in one list (``run.history``). The components own their
data: :class:`~babelfeed.run.steps.StepLog` (world sizes), ``weights`` (weight changes, update counts, an LM blend;
bound to the planner that plans with them), :class:`~babelfeed.run.edits.Edits`,
:class:`~babelfeed.run.skips.Skips` and :class:`~babelfeed.run.ledger.Ledger`. A component added later writes its
events and fields through here; no iterator assembles a state field by field.
"""

from __future__ import annotations

import copy
import hashlib
import json
import numbers
import warnings

from babelfeed.errors import Notice, StateError, StateMismatch, UsageError, UsageTypeError, user_frame
from babelfeed.plan.options import OPTION_KEYS, UNSTATED  # (shown at its default when absent)
from babelfeed.run.edits import Edits
from babelfeed.run.history import VERSION, Views, check, compose
from babelfeed.run.ledger import Ledger
from babelfeed.run.skips import Skips
from babelfeed.run.steps import StepLog


KINDS = ("translation", "lm")


# What ``set_state(state, mixture_change=...)`` does with a state of another config:
MIXTURE_CHANGES = {
    "refuse": "refused, naming what differs (the default)",
    "allow": "an edit: every stream goes on from its position under this config, from the next step; the planning "
             "window in progress gives its rows not yet served back to their streams, so nothing is repeated or "
             "skipped (the data of a kept stream and the seed must be the same)",
    "keep_position": "this config's plan from the state's epoch and global batch: the saved plan's samples not yet "
                     "served there may be skipped and its served ones come again (which ones is not known); the "
                     "only choice for a state with no fingerprint or config (an older babelfeed's) or of changed "
                     "data",
}
# what a state mismatch says about the choices (the command line, which takes no such choice, leaves it out)
EDIT_HINT = (" (set_state(state, mixture_change='allow') continues an edited mixture from its next step, every "
             "stream from its position; mixture_change='keep_position' resumes at the same global batch of this "
             "config's plan, repeating or skipping samples)")


def no_strict(strict) -> None:
    """``strict=`` is gone: say what takes its place (rather than a bare "unexpected keyword argument")."""
    if strict is not None:
        raise UsageTypeError("strict= is gone: set_state(state, mixture_change='keep_position') does what strict=False "
                             "did (this config's plan at the state's position) and says what it may repeat or skip; "
                             "mixture_change='allow' continues an edited config from the next step, every stream where "
                             "it stood")


def check_mixture_change(value) -> None:
    if value not in MIXTURE_CHANGES:
        raise UsageError(f"mixture_change must be one of {list(MIXTURE_CHANGES)}, got {value!r}: "
                         + "; ".join(f"{k!r}: {v}" for k, v in MIXTURE_CHANGES.items()))


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Options stated only where another is: max_repeats with spread_copies, the cap's rounding with max_upsample
FOLLOWS = {"max_repeats": "spread_copies", "max_upsample_counts": "max_upsample"}


def identity_changes(saved, now) -> list[str]:
    """What differs between two identities (plan options, split, shards, per-stream data), in the config's words:
    ``batching.max_tokens 2048 -> 4096``, ``the data of stream x changed``, ``stream y added``."""
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return []

    out = []
    a, b = saved.get("opts") or {}, now.get("opts") or {}
    for k in sorted(set(a) | set(b)):
        if a.get(k) == b.get(k):
            continue
        follows = FOLLOWS.get(k)  # an option stated only with another: its change is that one's
        if follows and (follows not in a or follows not in b) and a.get(follows) != b.get(follows):
            continue
        note = " (a state of the placement of copies before it: batches cut otherwise)" \
            if k == "max_repeats" and k not in a and a.get("spread_copies") else \
            " (a state of a cap rounded otherwise: a direction could take one sample more)" \
            if k == "max_upsample_counts" and k not in a and a.get("max_upsample") else ""
        name = "mixing.max_upsample's rounding" if k == "max_upsample_counts" else OPTION_KEYS.get(k, k)
        out.append(f"{name} {_short(a.get(k, UNSTATED.get(k)))} -> "
                   f"{_short(b.get(k, UNSTATED.get(k)))}{note}")
    for k in ("split", "shards"):
        if saved.get(k) != now.get(k):
            out.append(f"data.{'train_split' if k == 'split' else 'shards'} {_short(saved.get(k))} -> {_short(now.get(k))}")
    sa, sb = saved.get("streams") or {}, now.get("streams") or {}
    gone, new = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
    moved = sorted(k for k in set(sa) & set(sb) if sa[k] != sb[k])
    if moved:
        out.append(f"the data of stream(s) {moved[:5]}{' ...' if len(moved) > 5 else ''} changed (other files, "
                   f"tokenizer or prefix tokens)")
    if gone:
        out.append(f"stream(s) {gone[:5]}{' ...' if len(gone) > 5 else ''} removed")
    if new:
        out.append(f"stream(s) {new[:5]}{' ...' if len(new) > 5 else ''} added")
    for k in sorted(set(saved) - {"opts", "split", "shards", "streams"}):
        if saved.get(k) != now.get(k):
            out.append(f"{k} {_short(saved.get(k))} -> {_short(now.get(k))}")
    return out


SEALED = ("fingerprint", "epoch", "consumed", "total_steps")


def seal(state: dict) -> str:
    """A digest of where a state stands (``SEALED``), written beside it: a position changed by hand (epoch 3 made
    2 or 4, with or without its step count) no longer matches it. It guards against edits and damage, not
    against someone who recomputes it."""
    values = [int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
              for v in (state.get(k) for k in SEALED)]  # (a restored pytree holds numpy integers)
    return hashlib.sha256(json.dumps(values, default=str).encode()).hexdigest()[:16]


def check_seal(state) -> None:
    """Refuse a state whose position does not match its seal (a state without one, an older babelfeed's, passes)."""
    if isinstance(state, dict) and "seal" in state and state["seal"] != seal(state):
        raise StateError(f"iterator state's position (epoch {state.get('epoch')}, consumed {state.get('consumed')}, "
                         f"total_steps {state.get('total_steps')}) is not the one it was saved at (its 'seal' differs): "
                         f"the state was edited or is damaged; resume from the state as saved")


class RunRecord:
    """What happened to a run besides its position, one component per kind of fact, and the envelope of its
    state. ``weights`` is bound by the iterator to the planner that plans with them (``bind_weights``): the
    planner reads them, the record writes and reads them in the state."""

    def __init__(self, kind: str, name: str, world_size: int, split: str, streams: int = 0):
        if kind not in KINDS:
            raise UsageError(f"a run is one of {KINDS}, got {kind!r}")
        self.kind, self.name = kind, name
        self.steps = StepLog(world_size, split)
        self.edits = Edits()
        self.skips = Skips()
        self.ledger = Ledger(streams)
        self.weights = None  # (bound: a planner's weights component)
        self.layout = None  # run.layout.Layout: what ids and stream numbers mean, once an edit changed the streams

    # ------------------------------------------------------------------------------------ the history
    def history(self) -> list:
        """The state's history: the world sizes, the weights and update counts of every segment, the edits, the
        skips (and an LM run's blend segments), composed into one list of events."""
        w = self.weights.get_state() if self.weights is not None else {"weights": [], "updates": [], "blend": []}
        return compose(self.steps.steps(), w["weights"], w["updates"], self.edits.events, self.skips.events,
                       self.steps.splits()) + [dict(e) for e in w["blend"]]

    @staticmethod
    def read(state: dict, total: int | None = None) -> Views:
        """The components' views of a state's history, checked (``HistoryError`` names a malformed event)."""
        return check(state["history"], total) if "history" in state else Views()

    # ------------------------------------------------------------------------------------ the envelope
    def envelope(self, position: dict, fingerprint: str, identity, fields: dict | None = None) -> dict:
        """The state: version, kind, name, the position, fingerprint, identity, history, then ``fields`` (the
        components' and the planner's: ledger, stream positions...)."""
        return {"version": VERSION, "kind": self.kind, "name": self.name, **position, "fingerprint": fingerprint,
                "history": self.history(), "identity": copy.deepcopy(identity), **(fields or {})}

    def check(self, state, fields: dict, optional: tuple = ()) -> None:
        """Refuse a state that is not a well-formed state of this run: not a dict, another version, kind or name,
        a missing or unknown field, an integer field (``fields``: name -> smallest value) that is not an integer
        at least that. The fingerprint is checked by :meth:`check_fingerprint`."""
        if not isinstance(state, dict):
            raise UsageTypeError(f"an iterator state is a dict (from get_state()), got {type(state).__name__}"
                                 + (" (a JSON string? json.loads it first)" if isinstance(state, (str, bytes)) else ""))
        if type(state.get("version")) is not int or state["version"] != VERSION:
            raise StateError(f"unknown iterator state version {state.get('version')!r} (this babelfeed writes "
                             f"{VERSION} and reads 1 to {VERSION})")
        kind = state.get("kind")  # (written since version 3; history.upgrade gives older states theirs)
        if kind not in KINDS:
            raise StateError(f"iterator state field 'kind' must be one of {list(KINDS)}, got {kind!r}")
        if kind != self.kind:
            raise StateError(f"this is a state of a {kind} iterator; this iterator is a {self.kind} iterator")
        unknown = sorted(set(state) - {"version", "kind", "name", "fingerprint", "identity", *fields, *optional})
        if unknown:
            raise StateError(f"iterator state has unknown fields {unknown} (edited, or from another program)")
        missing = [k for k in ("name", *fields) if k not in state]
        if missing:
            raise StateError(f"iterator state lacks {missing}")
        for key, smallest in fields.items():
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < smallest:
                raise StateError(f"iterator state field {key!r} must be an integer >= {smallest}, got {value!r}")
        if state["name"] != self.name:
            raise StateError(f"iterator state is for the {state['name']!r} iterator, this one is {self.name!r}")
        if "fingerprint" in state and not isinstance(state["fingerprint"], str):
            raise StateError(f"iterator state fingerprint must be a string, got {state['fingerprint']!r}")

    @staticmethod
    def check_fingerprint(state: dict, fingerprints: tuple, identity) -> None:
        """Refuse a state saved with other data or settings than ``fingerprints`` (this run's, the first the one it
        writes), naming what changed (``identity``: this run's, against the state's)."""
        if "fingerprint" not in state:
            raise StateError("iterator state has no fingerprint (saved by an older babelfeed): nothing proves it "
                             "belongs to this data and these settings. set_state(state, "
                             "mixture_change='keep_position') resumes at its position anyway.")
        if state["fingerprint"] not in fingerprints:
            changed = identity_changes(state.get("identity"), identity)
            what = "; ".join(changed) if changed else f"fingerprint {state['fingerprint']} != {fingerprints[0]}"
            own = (" (the state carries the config it was saved with, its 'config': a state saved before an edit of "
                   "this run, as a rollback takes, resumes with that config; `babelfeed edit` shows what differs)"
                   if isinstance(state.get("config"), dict) else "")
            raise StateMismatch(
                f"iterator state was saved with different data or settings ({what}): resuming would not continue "
                f"the same stream. Resume with the config and data it was saved with{own}{EDIT_HINT}")

    @staticmethod
    def say_kept_position(state: dict, fingerprints: tuple, identity, position: tuple) -> None:
        """Say, once, that a state of another plan resumed at its position of this one (``keep_position``)."""
        if state.get("fingerprint") in fingerprints:
            return
        what = "; ".join(identity_changes(state.get("identity"), identity)) or "a state with no fingerprint"
        epoch, consumed = position
        warnings.warn(f"resumed at epoch {epoch}, global batch {consumed} of this config's plan, which is not the plan "
                      f"the state was saved with ({what}): from here the batches are this plan's, so samples the "
                      f"saved run had planned and not served may be skipped and samples it served may come again "
                      f"(which ones is not known; mixture_change='allow' continues every stream where it stood "
                      f"instead)", Notice, stacklevel=user_frame())
