"""A run's history: one list of events, the one change log of a state (version 2).

What happened to a run, in the order it happened, is what makes its batches a pure function of its config and
data. A state keeps it as one list, ``state["history"]``, of events (dicts with an ``"event"`` key):

``{"event": "ranks", "step": s, "epoch": e, "consumed": c, "world_size": w}``
    from training step ``s + 1`` on, steps were taken on ``w`` ranks, counted from global batch ``c`` of epoch
    ``e``. The first one is the run's start (``step`` 0; later for a run resumed from a state that did not
    record it); each later one a resume on another world size.
``{"event": "weights", "batch": b, "weights": {task: weight}}``
    ``set_weights``: from the stream window that starts at global batch ``b`` (since training began) on, these
    task weights. A mixture edit ends them: the edited config's weights rule after it.
``{"event": "updates", "batch": b, "update": u, "per": p}``
    a mixing schedule's update count: from global batch ``b`` (update ``u``) on, an update is ``p`` global
    batches (a resume on another world size or accumulation changes it). An event replaces the counts listed
    before it that start at ``b`` or later (they were not in effect yet).
``{"event": "edit", "step": s, "epoch": e, "batch": g, "changes": {key: [old, new]}}``
    a mixture edit: after ``s`` steps, from global batch ``g`` of epoch ``e`` on, the run follows another config
    (``changes``: what differs). The planning window in progress was left there: its rows not yet served went
    back to their streams (``babelfeed.plan.parts``). The weights and update counts listed before it are the
    segment's before the edit. (States of babelfeed 0.1 hold edits of another shape, ``saved_at_step``,
    ``global_batch`` and ``saved``: the saved window was finished first and the edit began the next epoch; they
    are read as they are.)

``{"event": "blend", "sample", "weights", "offsets", "names"}``
    an LM run's blend from global sample ``sample`` on: its weights and where each dataset stood
    (``babelfeed.lm.mixture``): the first segment, then each ``set_weights`` and mixture edit.
``{"event": "skip", "step", "reason", ...}``
    ``it.skip``: from training step ``step + 1`` on, these steps' batches, these samples or the samples of these
    corpora are dropped from their batches (``babelfeed.run.skips``). Listed after the other events, in
    the order made.

Each part of an iterator keeps its own view of the list (the planner its weights and update counts, the iterator
its step segments and edits): :func:`views` reads them out of a history, :func:`compose` writes one from them.
:func:`check` is the one validator; :func:`upgrade` turns a version-1 state (four logs: ``steps``, ``weights``,
``edits`` with the saved run's weights and counts, ``stream.updates``) into this one, so states written by
earlier babelfeeds load.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field

from babelfeed.checks import MAX_WORLD_SIZE
from babelfeed.errors import HistoryError
from babelfeed.run.skips import SHAPE as SKIP_SHAPE, event_ok as skip_event_ok

VERSION = 3




@dataclass
class Views:
    """The history as each part of an iterator reads it. ``steps``: ``[[steps before, epoch, consumed,
    world size], ...]``; ``weights``: the current segment's ``[[batch, {task: weight}], ...]``; ``updates``:
    ``[[batch, update, per], ...]`` in effect (``[]``: none recorded); ``edits``: per mixture edit its fields,
    with ``saved`` holding the saved run's position, weights and update counts (absent where an older
    babelfeed did not record them)."""

    steps: list = field(default_factory=list)
    splits: list = field(default_factory=list)  # per step segment: "batches", "rows" (how its ranks split), None
    weights: list = field(default_factory=list)
    updates: list = field(default_factory=list)
    edits: list = field(default_factory=list)
    blend: list = field(default_factory=list)
    skips: list = field(default_factory=list)


def _int(x, smallest: int = 0) -> bool:
    return type(x) is int and x >= smallest


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and x >= 0 and x != float("inf")


EDIT_FIELDS = ("saved_at_step", "step", "global_batch", "epoch")
SHAPES = {
    "ranks": "{'event': 'ranks', 'step': int >= 0, 'epoch': int >= 1, 'consumed': int >= 0, 'world_size': int >= 1, "
             "'split'?: 'rows' | 'batches'}",
    "weights": "{'event': 'weights', 'batch': int >= 0, 'weights': {task: number >= 0}}",
    "updates": "{'event': 'updates', 'batch': int >= 0, 'update': number >= 0, 'per': int >= 1}",
    "blend": "{'event': 'blend', 'sample': int >= 0, 'weights': {data key: number >= 0}, 'offsets': {data key: int "
             ">= 0}, 'names': {data key: name}, 'changes'?: {key: [old, new]}} (an LM run's blend from 'sample' on)",
    "edit": "{'event': 'edit', 'step': int >= 0, 'epoch': int >= 1, 'batch': int >= 0, 'changes': {key: [old, new]}}",
    "skip": SKIP_SHAPE,
}


def _event_ok(e) -> bool:
    kind = e.get("event")
    if kind == "ranks":
        return (set(e) - {"split"} == {"event", "step", "epoch", "consumed", "world_size"} and _int(e["step"])
                and _int(e["epoch"], 1) and _int(e["consumed"]) and _int(e["world_size"], 1)
                and e["world_size"] <= MAX_WORLD_SIZE
                and e.get("split", "batches") in ("batches", "rows"))
    if kind == "weights":
        return (set(e) == {"event", "batch", "weights"} and _int(e["batch"]) and isinstance(e["weights"], dict)
                and all(isinstance(k, str) and _number(v) for k, v in e["weights"].items()))
    if kind == "updates":
        return (set(e) == {"event", "batch", "update", "per"} and _int(e["batch"]) and _number(e["update"])
                and _int(e["per"], 1))
    if kind == "blend":
        w, o, n = e.get("weights"), e.get("offsets"), e.get("names")
        return (set(e) - {"changes"} == {"event", "sample", "weights", "offsets", "names"} and _int(e["sample"])
                and isinstance(w, dict) and isinstance(o, dict) and isinstance(n, dict) and len(w) > 0
                and all(_number(v) for v in w.values()) and sum(w.values()) > 0
                and all(_int(v) for v in o.values()) and set(w) <= set(o) and set(w) <= set(n)
                and all(isinstance(v, str) for v in n.values()) and isinstance(e.get("changes", {}), dict))
    if kind == "skip":
        return skip_event_ok(e)
    if kind == "edit" and "saved_at_step" not in e:
        return (set(e) == {"event", "step", "epoch", "batch", "changes"} and _int(e["step"]) and _int(e["epoch"], 1)
                and _int(e["batch"]) and isinstance(e["changes"], dict))
    if kind == "edit":  # (babelfeed 0.1's: the saved window finished first)
        saved = e.get("saved", {})
        return (set(e) - {"saved"} == {"event", *EDIT_FIELDS, "changes"} and all(_int(e[f]) for f in EDIT_FIELDS)
                and e["epoch"] >= 1 and e["step"] >= e["saved_at_step"] and isinstance(e["changes"], dict)
                and (saved == {} and "saved" not in e or isinstance(saved, dict)
                     and set(saved) == {"epoch", "consumed"} and _int(saved["epoch"], 1) and _int(saved["consumed"])))
    return False


def check(history, total_steps: int | None = None) -> Views:
    """The views of a state's ``history``, refusing (naming the event and what it should be) what is not well
    formed: an unknown or malformed event, steps out of order or past ``total_steps``, weight changes out of
    training order, update counts that do not start at the run's first batch."""
    if not isinstance(history, list):
        raise HistoryError(f"iterator state field 'history' must be a list of events, got {str(history)[:200]}")
    for i, e in enumerate(history):
        if not isinstance(e, dict) or not _event_ok(e):
            kind = e.get("event") if isinstance(e, dict) else None
            want = (SHAPES.get(kind) if isinstance(kind, str) else None) or f"an event of the kinds {sorted(SHAPES)}"
            raise HistoryError(f"iterator state field 'history' event {i} is {str(e)[:200]}; it must be {want}")
    v = views(history)
    steps = [s[0] for s in v.steps]
    skips = [e["step"] for e in history if e["event"] == "skip"]
    if total_steps is not None and skips and skips[-1] > total_steps:
        raise HistoryError(f"iterator state field 'history': a skip made after step {skips[-1]} lies past the "
                           f"state's own total_steps={total_steps}")
    at = [(e["step"], e.get("sample", 0), e.get("epoch", 0), e.get("batch", 0)) for e in history
          if e["event"] == "skip"]
    if any(a > b for a, b in zip(at, at[1:])):
        raise HistoryError(f"iterator state field 'history': skip events must come in training order; they are at "
                           f"steps {[a[0] for a in at][:20]}")
    if any(a > b for a, b in zip(steps, steps[1:])) or (total_steps is not None and steps and steps[-1] > total_steps):
        raise HistoryError(f"iterator state field 'history': the 'ranks' events must come in training order up to "
                           f"total_steps={total_steps}; their steps are {steps[:20]}")
    blends = [h["sample"] for h in history if h["event"] == "blend"]
    if any(a >= b for a, b in zip(blends, blends[1:])):
        raise HistoryError(f"iterator state field 'history': an LM run's blend events must come in training order, "
                           f"one per sample; they start at samples {blends[:20]}")
    marks = [h.get("saved_at_step", h["step"]) for h in history if h["event"] == "edit"]
    if any(a > b for a, b in zip(marks, marks[1:])):
        raise HistoryError(f"iterator state field 'history': mixture edits must come in training order; saved at "
                           f"steps {marks[:20]}")
    segment: list = []
    for e in history:
        if e["event"] == "edit":
            segment = []
        elif e["event"] == "weights":
            if segment and e["batch"] < segment[-1]:
                raise HistoryError(f"iterator state field 'history': weight changes must come in training order; "
                                   f"global batch {e['batch']} follows {segment[-1]}")
            segment.append(e["batch"])
    if v.updates and v.updates[0][:2] not in ([0, 0.0], [0, 0]):
        raise HistoryError(f"iterator state field 'history': update counts must start at global batch 0, update 0; "
                           f"they start at {v.updates[0]}")
    return v


def _fold(updates: list, event: list) -> list:
    b = event[0]
    out = [u for u in updates]
    while out and out[-1][0] >= b:
        out.pop()
    return out + [list(event)]


def views(history: list) -> Views:
    """Each part's view of a (well-formed) history; see :class:`Views`."""
    v = Views()
    weights: list = []
    updates: list = []
    for e in history:
        kind = e["event"]
        if kind == "ranks":
            v.steps.append([e["step"], e["epoch"], e["consumed"], e["world_size"]])
            v.splits.append(e.get("split"))  # (None: a state of an earlier babelfeed, which did not say)
        elif kind == "weights":
            weights.append([e["batch"], dict(e["weights"])])
        elif kind == "updates":
            updates = _fold(updates, [e["batch"], e["update"], e["per"]])
        elif kind == "blend":
            v.blend.append(copy.deepcopy(e))
        elif kind == "skip":
            v.skips.append(copy.deepcopy(e))
        elif kind == "edit":
            edit = {k: copy.deepcopy(x) for k, x in e.items() if k != "event"}
            if "saved" in e or "saved_at_step" not in e:  # (the segment before it: its weights, update counts)
                edit["saved"] = {**e.get("saved", {}), "weights": weights, "updates": [list(u) for u in updates]}
            v.edits.append(edit)
            weights = []
    v.weights = weights
    v.updates = updates
    return v


def _updates_to(have: list, want: list) -> list:
    """The update events that turn the counts in effect ``have`` into ``want``."""
    want = [list(u) for u in want]
    if not want:
        return []
    for q in range(len(want) - 1, -1, -1):  # the shortest tail of ``want`` that, listed, gives ``want``
        got = have
        for u in want[q:]:
            got = _fold(got, u)
        if got == want and (q == 0 or have[:q] == want[:q]):
            return want[q:]
    return want


def _i(x) -> int:
    """An integer as it is (numpy's included), never a float, a string or a bool made one."""
    if isinstance(x, bool):
        raise HistoryError(f"{x!r} is not an integer")
    return operator.index(x)


def compose(steps: list, weights: list, updates: list, edits: list, skips: list = (), splits=None) -> list:
    """The history of a run from its parts' views (see :class:`Views`): ``edits`` with their ``saved`` run's
    weights and update counts, ``weights`` and ``updates`` of the segment after the last edit, then ``skips``;
    ``splits``: per step segment, how its ranks split (recorded where known)."""
    out: list = []
    have: list = []
    ranks = [{"event": "ranks", "step": _i(s), "epoch": _i(e), "consumed": _i(c), "world_size": _i(w)}
             for s, e, c, w in steps]
    for r, split in zip(ranks, splits or ()):
        if split is not None:
            r["split"] = split

    def ranks_until(step: int) -> None:  # the world-size segments that began before a mark
        while ranks and ranks[0]["step"] < step:
            out.append(ranks.pop(0))

    def segment(ws: list, us: list) -> None:
        nonlocal have
        out.extend({"event": "weights", "batch": _i(b), "weights": dict(w)} for b, w in ws)
        for b, u, p in _updates_to(have, us):
            out.append({"event": "updates", "batch": _i(b), "update": u, "per": _i(p)})
        have = [list(x) for x in us] if us else have

    for edit in edits:
        ranks_until(_i(edit.get("saved_at_step", edit["step"])) + 1)
        saved = edit.get("saved")
        if saved:
            segment(saved.get("weights", []), saved.get("updates", []))
        event = {"event": "edit", **{k: copy.deepcopy(x) for k, x in edit.items() if k != "saved"}}
        if saved and "saved_at_step" in edit:
            event["saved"] = {"epoch": _i(saved["epoch"]), "consumed": _i(saved["consumed"])}
        out.append(event)
    ranks_until(1 << 62)
    segment(weights, updates)
    return out + [copy.deepcopy(e) for e in skips]


def world_size_at(steps: list, step: int | None = None) -> int | None:
    """The world size that took training step ``step`` (1-based; ``None``: the latest), from the step segments
    of :class:`Views` (``None`` when they do not say)."""
    earlier = [s for s in steps if step is None or s[0] < step]
    return int(earlier[-1][3]) if earlier else None


def split_at(steps: list, splits: list, step: int | None = None) -> str | None:
    """How the ranks that took training step ``step`` split their batches ("batches" or "rows"), from the step
    segments and splits of :class:`Views` (``None`` when they do not say)."""
    earlier = [sp for s, sp in zip(steps, splits) if step is None or s[0] < step]
    return earlier[-1] if earlier else None


def split_of(state, step: int | None = None) -> str | None:
    """How the ranks of the run whose state is ``state`` split the batches of ``step``, where it says."""
    if not isinstance(state, dict) or "history" not in state:
        return None
    try:
        v = check(upgrade(state)["history"])
    except (HistoryError, KeyError, TypeError):
        return None
    return split_at(v.steps, v.splits, step)


def ran_on(state, step: int | None = None) -> int | None:
    """The world size that took ``step`` (``None``: the latest) of the run whose state (any version) or loader
    position is ``state``, where it says; ``None`` where it does not."""
    if not isinstance(state, dict):
        return None
    if "version" not in state:  # a loader position: the world size it names, or its base state's
        w = state.get("world_size")
        return w if _int(w, 1) else ran_on(state.get("base"), step)
    state = upgrade(state)
    try:
        steps = check(state["history"]).steps if "history" in state else []
    except HistoryError:
        return None
    return world_size_at(steps, step)


def upgrade(state):
    """A state of any version this babelfeed reads, as the current version (others are returned as they are,
    for the checks to name): the one place that knows older states. Version 1 kept four logs (``steps``,
    ``weights``, ``edits`` and ``stream.updates``); version 2 one history but no ``kind`` on translation states,
    and the streams' data identities inside ``stream``."""
    if not isinstance(state, dict) or type(state.get("version")) is not int or state["version"] not in (1, 2):
        return state
    if state["version"] == 1:
        state = _from_v1(state)
    out = dict(state)
    out["version"] = VERSION
    out.setdefault("kind", "lm" if "consumed_samples" in state else "translation")
    stream = out.get("stream")
    if isinstance(stream, dict) and "data" in stream:
        out["stream"] = {k: v for k, v in stream.items() if k != "data"}
        out["data"] = stream["data"]
    return out


def _from_v1(state: dict) -> dict:
    if "consumed_samples" in state or state.get("kind") == "lm":
        return {**state, "version": 2}
    out = {k: v for k, v in state.items() if k not in ("steps", "weights", "edits")}
    stream = state.get("stream")
    updates: list = []
    if isinstance(stream, dict):
        updates = stream.get("updates") or []
        out["stream"] = {k: v for k, v in stream.items() if k != "updates"}
    parts = (state.get("steps") or [], state.get("weights") or [], updates, state.get("edits") or [])
    try:
        history = compose(*parts)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError):
        raise HistoryError(f"this version-1 state's logs (steps, weights, edits, stream.updates) are not well "
                           f"formed: {str(parts)[:300]}") from None
    out["version"] = 2
    out["history"] = history
    return out
