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

FIELDS = ("samples", "src_tokens", "tgt_tokens")


def window_totals(direction: np.ndarray, src_len: np.ndarray, tgt_len: np.ndarray, streams: int) -> np.ndarray:
    """``int64[3, streams]``: samples, source tokens and target tokens per stream of a set of samples."""
    d = np.asarray(direction, np.int64)
    out = np.empty((3, streams), np.int64)
    out[0] = np.bincount(d, minlength=streams)
    out[1] = np.bincount(d, weights=np.asarray(src_len, np.float64), minlength=streams).round()
    out[2] = np.bincount(d, weights=np.asarray(tgt_len, np.float64), minlength=streams).round()
    return out


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


def flat(totals: np.ndarray, keys: list[str], rows: np.ndarray, epoch: int, step: int | None,
         prefix: str = "ledger") -> dict:
    """A flat dict of numbers for TensorBoard, W&B or absl logging: per stream ``{prefix}/{stream}/samples``,
    ``src_tokens``, ``tgt_tokens`` and ``passes`` (served samples over the stream's rows, rounded down), and the
    totals ``{prefix}/samples``, ``{prefix}/tokens``, ``{prefix}/epoch`` and ``{prefix}/step``."""
    out: dict = {}
    for j, k in enumerate(keys):
        for i, f in enumerate(FIELDS):
            out[f"{prefix}/{k}/{f}"] = int(totals[i, j])
        out[f"{prefix}/{k}/passes"] = int(totals[0, j] // rows[j]) if rows[j] else 0
    out[f"{prefix}/samples"] = int(totals[0].sum())
    out[f"{prefix}/tokens"] = int(totals[1].sum() + totals[2].sum())
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


def _ranks(segments, upto: int | None = None) -> str:
    parts = []
    for i, (start, _, _, ws) in enumerate(segments):
        stop = segments[i + 1][0] if i + 1 < len(segments) else None
        parts.append(f"steps {start + 1}-{stop if stop is not None else ''} on {ws} rank(s)")
    return ", ".join(parts)


def step_position(it, step: int, state: dict | None = None) -> tuple[int, int]:
    """``(epoch, first global batch)`` of training step ``step`` (1-based, counted since training began, as
    loggers number optimizer steps) for iterator ``it``'s world size and split. ``state`` (a ``get_state()``
    taken during the run) anchors the count and says which world size took each step (its ``steps``); without
    one, the iterator's own count is used (from the state it was resumed from), else the count starts at epoch
    1. A step taken on another world size than ``it``'s is refused, naming the world size to trace it with.
    Earlier and later epochs are planned (integers only) to find where each begins."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step must be an integer >= 1 (steps count from 1), got {step!r}")
    per = it.batches_per_step
    planner = it.planner

    def steps_in(epoch: int, consumed: int = 0) -> int:
        return -(-(planner.num_batches(epoch) - consumed) // per)

    if state is not None:
        it.set_state(state)  # checks the state against this data and these settings
        segments = state.get("steps")
    else:
        segments = getattr(it, "step_log", None) or None
    edits = getattr(it, "edits", [])
    last_edit = edits[-1]["step"] if edits else 0
    if edits and step <= last_edit:
        raise ValueError(f"step {step} is before this run's last mixture edit (its mixture begins after step "
                         f"{last_edit}): trace it with the config and a state from before the edit")
    if segments:
        seg = [x for x in segments if x[0] < step][-1]
        if seg[3] != it.world_size:
            raise ValueError(f"step {step} was taken on {seg[3]} rank(s) (this run: {_ranks(segments)}); trace it "
                             f"with that world size (--world-size {seg[3]}), not {it.world_size}")
        # the latest point where the count is known: the last edit, or the start of the step's segment
        if edits and seg[0] < last_edit:
            epoch, consumed, first = int(edits[-1]["epoch"]), 0, last_edit + 1
        else:
            epoch, consumed, first = int(seg[1]), int(seg[2]), int(seg[0]) + 1
    elif edits:  # an edited run: this config's plan begins with the epoch after the last edit
        epoch, consumed, first = int(edits[-1]["epoch"]), 0, last_edit + 1
    elif state is not None:  # a state of an older babelfeed (no 'steps'): counted back from where it stands
        epoch, c, total = int(state["epoch"]), int(state["consumed"]), int(state["total_steps"])
        first, consumed = total - -(-c // per) + 1, 0
        while step < first and epoch > 1:
            epoch -= 1
            first -= steps_in(epoch)
        if step < first:
            raise ValueError(f"step {step} is before the run began by this state's count (its epoch 1 began at step "
                             f"{first}): was the run resumed on another world size? pass that world size")
    else:
        epoch, consumed, first = 1, 0, 1
    from tqdm.auto import tqdm

    bar, walked = None, 0  # a step many epochs on plans every epoch before it (integers only; it adds up): say so
    while step >= first + steps_in(epoch, consumed):
        first += steps_in(epoch, consumed)
        epoch, consumed = epoch + 1, 0
        walked += 1
        if bar is None and walked >= 50:
            bar = tqdm(desc=f"planning epochs up to step {step:,}", unit="epoch", total=None, leave=False)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return epoch, consumed + (step - first) * per


def trace(it, step: int, state: dict | None = None) -> list[dict]:
    """The samples of training step ``step`` (see :func:`step_position`), every rank's: per sample ``{"step",
    "epoch", "batch" (global batch of the epoch), "rank", "id", "stream", "task", "corpus", "shard", "row",
    "src_len", "tgt_len"}``, in each batch's plan order. ``it``: an iterator of the run's config and world size."""
    epoch, g0 = step_position(it, step, state)
    planner = it.planner
    out: list = []
    for k in range(it.batches_per_step):
        g = g0 + k
        where = planner.locate(epoch, g)
        if where is None:  # the epoch's last step: this rank's batch is an epoch-padding one
            continue
        w, j = where
        win = planner.window(epoch, w)
        rows = win.batch_rows(np.array([j]))
        s = win.samples
        ids = it.collater.ids(s.comp[rows].astype(np.int64), s.local[rows])
        for d, sl, tl in zip(describe_ids(planner.sources, it.collater.id_base, ids), s.src_len[rows].tolist(),
                             s.tgt_len[rows].tolist()):
            out.append({"step": step, "epoch": epoch, "batch": g, "rank": k if it.split == "batches" else None,
                        **d, "src_len": int(sl), "tgt_len": int(tl)})
    return out
