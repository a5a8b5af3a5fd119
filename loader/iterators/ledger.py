"""What a run has consumed, per stream, and where each sample of a batch came from.

The ledger counts, for every stream (a direction, or a task's corpus), the samples and tokens that all ranks
together have taken up to the iterator's position, the same on every rank: served samples only (not the masked
rows that fill static shapes or the epoch's last step, not the too-long samples the filter drops), and their
tokens as stored (prefix tokens included, before any noise). It is computed from the plan, not from batches
seen, so it is exact on every rank, after a resume, and with DataLoader or grain workers.

Per window the planner records the totals of its samples when it plans it (:func:`window_totals`); the ledger at
a position is the ledger at the epoch's start (kept in the iterator's state) plus the windows before the position
and the served part of its window.

Provenance: ``id`` in a batch is a sample's index over every component (shard of a stream) of the split, and
:func:`describe_ids` turns ids back into (stream, task, corpus, shard, row).
"""

from __future__ import annotations

import numpy as np

from babelfeed.errors import StateError, UsageError, UsageTypeError
from babelfeed.iterators.replay import _build, _views, cached, row_ranks, state_key, step_rows, step_source
from babelfeed.plan.totals import window_totals  # noqa: F401  (part of the ledger's face)
from babelfeed.run.history import upgrade
from babelfeed.run.record import check_seal
from babelfeed.run.ledger import FIELDS, as_state, flat, from_state, skipped_from_state, skipped_state  # noqa: F401
from babelfeed.run.skips import Skips


def describe_ids(sources, id_base: np.ndarray, ids, removed=()) -> list[dict]:
    """Per id (from a batch's ``id``): ``{"id", "stream", "task", "corpus", "shard", "row"}``; ``-1`` (the
    epoch-padding batches' ids) gives ``None``. ``id_base``: each component's first id and, last, the first id not
    used (``Collater.id_base``; a run edited keeps its ids, so they need not be in order); ``removed``: ``(first
    id, rows, stream, shard)`` of shards an edit removed, whose ids still name them (task and corpus None)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    comps = sources.components
    starts = [(int(id_base[c]), len(comps[c]), c) for c in range(len(comps))]
    starts += [(a, n, -1 - i) for i, (a, n, _, _) in enumerate(removed)]
    starts.sort()
    first = np.array([a for a, _, _ in starts], np.int64)
    total = int(id_base[-1])
    at = np.searchsorted(first, ids, side="right") - 1
    specs = {s.name: s for s in sources.streams}
    out: list = []
    for i, k in zip(ids.tolist(), at.tolist()):
        if i == -1:
            out.append(None)
            continue
        if i < -1 or i >= total or k < 0 or i >= starts[k][0] + starts[k][1]:
            raise UsageError(f"sample id {i} is not an id of this data (ids run from 0 to {total - 1}; -1 marks an "
                             f"epoch-padding row)")
        base, _, c = starts[k]
        if c < 0:  # a shard an edit removed: its ids still name it
            _, _, stream, shard = removed[-1 - c]
            out.append({"id": i, "stream": stream, "task": None, "corpus": None, "shard": shard, "row": i - base})
            continue
        component = comps[c]
        spec = specs[component.key]
        out.append({"id": i, "stream": component.key, "task": spec.task, "corpus": spec.key,
                    "shard": int(component.shard), "row": i - base})
    return out


def check_trace_state(it, state: dict) -> None:
    """Refuse a state that is not a state of this data: another fingerprint (without the stream sampler), or a
    state the run's own config (carried in it) does not resume on this data (with it)."""
    if not isinstance(state, dict):
        raise UsageTypeError(f"an iterator state is a dict (from get_state()), got {type(state).__name__}")
    if state.get("kind") == "lm":
        raise StateError("this is a state of an LM run (it counts consumed_samples); the config is a translation "
                         "config: give the LM run's config (its data_path)")
    it._refuse_a_stream_state(state, "use the run's config")
    edited = isinstance(state.get("history"), list) and any(isinstance(e, dict) and e.get("event") == "edit"
                                                            for e in state["history"])
    if (it.planner.sampler.streams or edited) and isinstance(state.get("config"), dict):
        def check():
            built = _build(state["config"], (it.config_snapshot or state["config"])["data"]["path"], it.world_size,
                           it.split, it)
            built.set_state(state, mixture_change="allow")
            return True

        cached(it, ("checked", state_key(state)), check)
        return
    it._check_state(state, True, {"epoch": 1, "consumed": 0, "total_steps": 0},
                    optional=it.STATE_FIELDS)
    it._check_extra(state)
    check_seal(state)


def trace(it, step: int, state: dict | None = None) -> list[dict]:
    """The samples of training step ``step`` (1-based, counted since training began, as loggers number optimizer
    steps), every rank's: per sample ``{"step", "epoch", "batch" (global batch of the epoch), "rank", "id",
    "stream", "task", "corpus", "shard", "row", "src_len", "tgt_len", "skipped"}`` (``skipped``: a skip of the
    run dropped it from its batch, so the model never saw it), in each batch's plan order, ids as the
    ranks received them. With ``split="rows"``, ``rank`` is the row block of the global batch that held the
    sample (the rank, unless the JAX adapter handed a process other blocks), None for a skipped one. ``state``:
    the run's latest state (default: ``it``'s own), which holds its history: the world size that took each step,
    weight changes and mixture edits; any step of the run is answered, on either side of any of them
    (``babelfeed.iterators.replay``). ``it``: an iterator of the run's data; its world size does not matter and its
    position is left as it was."""
    if state is None:
        state = it.get_state()
    else:
        state = upgrade(state)  # (a state an older babelfeed wrote)
        check_trace_state(it, state)

    src = step_source(it, step, state)
    skips = Skips(_views(state).skips)
    ranks = row_ranks(src, skips) if src.it.split == "rows" else None  # (which rank's rows, once ordered)
    out: list = []
    for k, g, ids, src_len, tgt_len, dropped in step_rows(src, skips):
        dropped = np.zeros(len(ids), bool) if dropped is None else dropped
        for d, sl, tl, x in zip(src.it.describe_ids(ids), src_len.tolist(), tgt_len.tolist(), dropped.tolist()):
            out.append({"step": step, "epoch": src.epoch, "batch": g,
                        "rank": k if ranks is None else ranks.get(d["id"]), **d, "src_len": int(sl),
                        "tgt_len": int(tl), "skipped": bool(x)})
    return out
