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

from babelfeed.plan.totals import FIELDS, window_totals  # noqa: F401  (part of the ledger's face)


def as_state(totals: np.ndarray, keys: list[str]) -> dict:
    """The JSON form kept in an iterator state: ``{field: {stream: count}}``."""
    return {f: {k: int(v) for k, v in zip(keys, totals[i].tolist())} for i, f in enumerate(FIELDS)}


def from_state(ledger, keys: list[str]) -> np.ndarray:
    """The totals of a state's ``ledger`` field, checked: every field, an integer >= 0 per stream of ``keys``."""
    if not isinstance(ledger, dict) or set(ledger) != set(FIELDS):
        raise ValueError(f"iterator state field 'ledger' must be {{{', '.join(FIELDS)}}} of {{stream: count}}, got "
                         f"{str(ledger)[:200]}")
    out = np.zeros((3, len(keys)), np.int64)
    for i, f in enumerate(FIELDS):
        counts = ledger[f]
        if not isinstance(counts, dict) or sorted(counts) != sorted(keys):
            have = sorted(counts) if isinstance(counts, dict) else counts
            raise ValueError(f"iterator state ledger[{f!r}] must count exactly the streams {keys}, got {have!r}"[:400])
        for j, k in enumerate(keys):
            v = counts[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"iterator state ledger[{f!r}][{k!r}] must be an integer >= 0, got {v!r}")
            out[i, j] = v
    return out


def skipped_state(totals: np.ndarray, keys: list[str], others: dict) -> dict:
    """The state's ``skipped`` field: ``{field: {stream: count}}`` of the rows the run's skips dropped, for this
    config's streams and (``others``: ``{stream: [3 counts]}``) streams an edit removed."""
    out = as_state(totals, keys)
    for k, counts in others.items():
        for i, f in enumerate(FIELDS):
            out[f][k] = int(counts[i])
    return out


def skipped_from_state(saved, keys: list[str]) -> tuple[np.ndarray, dict]:
    """The totals of a state's ``skipped`` field for streams ``keys`` (0 where it names none), and the counts
    it holds for other streams (an edit removed them), checked."""
    if not isinstance(saved, dict) or set(saved) != set(FIELDS):
        raise ValueError(f"iterator state field 'skipped' must be {{{', '.join(FIELDS)}}} of {{stream: count}}, "
                         f"got {str(saved)[:200]}")
    out = np.zeros((3, len(keys)), np.int64)
    others: dict = {}
    index = {k: j for j, k in enumerate(keys)}
    for i, f in enumerate(FIELDS):
        counts = saved[f]
        if not isinstance(counts, dict):
            raise ValueError(f"iterator state skipped[{f!r}] must map streams to counts, got {str(counts)[:200]}")
        for k, v in counts.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or not isinstance(k, str):
                raise ValueError(f"iterator state skipped[{f!r}][{k!r}] must be an integer >= 0, got {v!r}")
            if k in index:
                out[i, index[k]] = v
            else:
                others.setdefault(k, [0, 0, 0])[i] = v
    return out, others


def flat(totals: np.ndarray, keys: list[str], rows: np.ndarray, epoch: int, step: int | None,
         prefix: str = "ledger", skipped: np.ndarray | None = None) -> dict:
    """A flat dict of numbers for TensorBoard, W&B or absl logging: per stream ``{prefix}/{stream}/samples``,
    ``src_tokens``, ``tgt_tokens`` and ``passes`` (served samples over the stream's rows, rounded down), and the
    totals ``{prefix}/samples``, ``{prefix}/tokens``, ``{prefix}/epoch`` and ``{prefix}/step``. Once the run
    skipped data (``skipped``: the same shape as ``totals``), per stream ``{prefix}/{stream}/skipped`` and
    ``skipped_tokens`` (source and target), and ``{prefix}/skipped``: samples the skips dropped, never served
    (``samples`` does not count them)."""
    out: dict = {}
    for j, k in enumerate(keys):
        for i, f in enumerate(FIELDS):
            out[f"{prefix}/{k}/{f}"] = int(totals[i, j])
        out[f"{prefix}/{k}/passes"] = int(totals[0, j] // rows[j]) if rows[j] else 0
        if skipped is not None:
            out[f"{prefix}/{k}/skipped"] = int(skipped[0, j])
            out[f"{prefix}/{k}/skipped_tokens"] = int(skipped[1, j] + skipped[2, j])
    out[f"{prefix}/samples"] = int(totals[0].sum())
    out[f"{prefix}/tokens"] = int(totals[1].sum() + totals[2].sum())
    if skipped is not None:
        out[f"{prefix}/skipped"] = int(skipped[0].sum())
    out[f"{prefix}/epoch"] = int(epoch)
    if step is not None:  # (a DataLoader's position counts batches, not the run's steps)
        out[f"{prefix}/step"] = int(step)
    return out


def describe_ids(sources, id_base: np.ndarray, ids) -> list[dict]:
    """Per id (from a batch's ``id``): ``{"id", "stream", "task", "corpus", "shard", "row"}``; ``-1`` (the
    epoch-padding batches' ids) gives ``None``. ``id_base``: each component's first id (``Collater.id_base``)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    total = int(id_base[-1])
    bad = ids[(ids < -1) | (ids >= total)]
    if len(bad):
        raise ValueError(f"sample id {int(bad[0])} is not an id of this data (ids run from 0 to {total - 1}; -1 marks "
                         f"an epoch-padding row)")
    comp = np.searchsorted(id_base, ids, side="right") - 1
    specs = {s.name: s for s in sources.streams}
    out: list = []
    for i, c in zip(ids.tolist(), comp.tolist()):
        if i < 0:
            out.append(None)
            continue
        component = sources.components[c]
        spec = specs[component.key]
        out.append({"id": i, "stream": component.key, "task": spec.task, "corpus": spec.key,
                    "shard": int(component.shard), "row": i - int(id_base[c])})
    return out


def check_trace_state(it, state: dict) -> None:
    """Refuse a state that is not a state of this data: another fingerprint (without the stream sampler), or a
    state the run's own config (carried in it) does not resume on this data (with it)."""
    if not isinstance(state, dict):
        raise ValueError(f"an iterator state is a dict (from get_state()), got {type(state).__name__}")
    if state.get("kind") == "lm" or "consumed_samples" in state:
        raise ValueError("this is a state of an LM run (it counts consumed_samples); the config is a translation "
                         "config: give the LM run's config (its data_path)")
    it._refuse_a_stream_state(state, "use the run's config")
    edited = isinstance(state.get("history"), list) and any(isinstance(e, dict) and e.get("event") == "edit"
                                                            for e in state["history"])
    if (it.planner.sampler.streams or edited) and isinstance(state.get("config"), dict):
        from babelfeed.iterators.replay import _build, cached, state_key

        def check():
            built = _build(state["config"], (it.config_snapshot or state["config"])["data"]["path"], it.world_size,
                           it.split)
            built.set_state(state, mixture_change="allow")
            return True

        cached(it, ("checked", state_key(state)), check)
        return
    it._check_state(state, True, {"epoch": 1, "consumed": 0, "total_steps": 0},
                    optional=it.STATE_FIELDS)
    it._check_extra(state)


def trace(it, step: int, state: dict | None = None) -> list[dict]:
    """The samples of training step ``step`` (1-based, counted since training began, as loggers number optimizer
    steps), every rank's: per sample ``{"step", "epoch", "batch" (global batch of the epoch), "rank", "id",
    "stream", "task", "corpus", "shard", "row", "src_len", "tgt_len", "skipped"}`` (``skipped``: a skip of the
    run dropped it from its batch, so the model never saw it), in each batch's plan order, ids as the
    ranks received them. With ``split="rows"``, ``rank`` is the row block of the global batch that held the
    sample (the rank, unless the JAX adapter handed a process other blocks), None for a skipped one. ``state``:
    the run's latest state (default: ``it``'s own), which holds its history: the world size that took each step,
    weight changes and mixture edits; any step of the run is answered, on either side of any of them
    (``babelfeed.replay``). ``it``: an iterator of the run's data; its world size does not matter and its
    position is left as it was."""
    from babelfeed.iterators.replay import row_ranks, step_rows, step_source

    if state is None:
        state = it.get_state()
    else:
        from babelfeed.iterators.history import upgrade

        state = upgrade(state)  # (a state an older babelfeed wrote)
        check_trace_state(it, state)
    from babelfeed.iterators.replay import _views
    from babelfeed.iterators.skips import Skips

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
