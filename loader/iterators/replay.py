"""A run's history replayed: which plan served any step of a run, from its latest state alone.

A translation run is a pure function of its first config, its data and what happened to it, which the state's
``history`` lists (``babelfeed.run.history``): the world sizes it ran on, the task weights fed back, how
schedule updates were counted and the mixture edits it was resumed with. Its ``config`` is the config in force
now, and each edit records the config values it changed (old and new) and where it took effect; the weights
and update counts listed before an edit are the segment's before it. So the config and the weights of every
earlier segment can be rebuilt by undoing the edits one after another.

:func:`step_source` replays that history with integers only (no token is read): it builds an iterator of the
first config, applies the weights of its segment, moves it to where the first edit took effect, continues an
iterator of the edited config from there (as the run did: ``continue_from``), and so on, up to the segment that
holds the step.
It then counts the step from the latest point where the count is known (the run's start, an edit, a resume on
another world size), so trace and replay answer for any step, on either side of any change.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass

import ml_collections
import numpy as np

from babelfeed.errors import StateError, UsageError
from babelfeed.iterators.protocol import MAX_EPOCHS_AHEAD
from babelfeed.plan.parts import Part
from babelfeed.run.history import Views, check, split_at, world_size_at
from babelfeed.run.skips import Skips
from babelfeed.run.weights import Weights
from babelfeed.sources.corpus import reusing


@dataclass
class StepSource:
    """Where training step ``step`` was served from: ``it`` (an iterator of the config in force then, on the
    world size that took the step, holding the weights of its segment), its epoch and first global batch
    ``g0``."""

    it: object
    epoch: int
    g0: int
    world_size: int


def _set_dotted(config: dict, key: str, value) -> None:
    *path, last = key.split(".")
    node = config
    for p in path:
        node = node.setdefault(p, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(value)


def configs_of(current: dict, edits: list) -> list[dict]:
    """The config of every segment of a run, first to last: ``current`` (the config in force now) with the
    edits' changes undone one after another, last edit first."""
    out = [copy.deepcopy(current)]
    for edit in reversed(edits):
        before = copy.deepcopy(out[0])
        for key, (old, _new) in edit.get("changes", {}).items():
            _set_dotted(before, key, old)
        out.insert(0, before)
    return out


def _apply_history(it, weights: list, updates) -> None:
    """Give a fresh (or just resumed) iterator the weight changes and update counts of its segment."""
    planner = it.planner
    if updates:
        segs = [(int(b), float(u), int(p)) for b, u, p in updates]
        if list(planner.update_segments) != segs:
            starts = dict(planner._starts)  # (where every stream began the epochs known: kept)
            planner.forget_plans()
            planner._starts = starts
            planner.update_segments = segs
    assert not planner.weight_changes, "weights are applied to a fresh or just resumed iterator"

    changes = Weights.check(weights or [], planner.sources.tasks)
    if changes:
        planner.setup(it.epoch)  # the epoch it stands in is planned: a change drops only what comes after it
    for at, w in changes:
        planner.set_weights(at, w)


def _views(state: dict):
    return check(state["history"]) if "history" in state else Views()


def _build(config: dict, data_path: str, world_size: int, split: str, reuse):
    """An iterator of ``config`` on this machine's data, built as ``reuse`` was and reusing what it has open."""
    cfg = ml_collections.ConfigDict(copy.deepcopy(config))
    cfg.data.path = data_path  # the data as this machine finds it
    with reusing(reuse.datasets(), reuse.dictionaries()):  # (the data the probe has open)
        return reuse.build_another(cfg, world_size=world_size, split=split)


def state_key(state: dict) -> str:
    """A digest of a state (what the replay's cache is keyed by)."""
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()


def cached(probe, key: tuple, make):
    """``make()``, remembered on ``probe`` under ``key`` (a few entries: tracing many steps of one state replays
    its history once per segment and world size)."""
    cache = probe.__dict__.setdefault("_replay_cache", {})
    if key not in cache:
        if len(cache) >= 16:
            cache.pop(next(iter(cache)))
        cache[key] = make()
    return cache[key]


def step_source(probe, step: int, state: dict) -> StepSource:
    """The plan that served training step ``step`` (1-based) of the run whose latest state is ``state``.
    ``probe``: an iterator of the run's data (its config's data path is used; its world size does not matter)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise UsageError(f"step must be an integer >= 1 (steps count from 1), got {step!r}")

    history = _views(state)
    segments = history.steps or [[0, 1, 0, probe.world_size]]
    world = world_size_at(segments, step)
    split = split_at(history.steps, history.splits, step) or probe.split
    edits = history.edits
    m = len([e for e in edits if e["step"] < step])
    it = cached(probe, ("segment", state_key(state), m, world, split),
                lambda: _segment(probe, state, m, world, split))
    src = _locate(it, step, segments, edits[m - 1] if m else None, world)
    if src.epoch < getattr(it, "_legacy_from", 0):
        raise StateError(f"step {step} lies in epoch {src.epoch}, between this run's last mixture edit and the "
                         f"state's epoch {it._legacy_from}, which a babelfeed older than this one recorded without "
                         f"what trace needs: trace it with a state saved in that epoch")
    return src


def _segment(probe, state: dict, m: int, world: int, split: str | None = None):
    """An iterator of the config in force after the run's first ``m`` edits, on ``world`` ranks that split the
    batches as ``split`` (default: the probe's), holding the weight changes and update counts of that segment
    (and, after an edit, where the edit began it)."""
    split = split or probe.split
    views = _views(state)
    edits = views.edits
    current = state.get("config")
    if current is None or not edits:
        if edits:
            raise StateError("this state records mixture edits but carries no config of its run: trace it with a "
                             "state saved by this babelfeed")
        it = probe if (probe.world_size, probe.split) == (world, split) else _rebuild(probe, world, split)
        _apply_history(it, views.weights, views.updates)
        return it
    data_path = (probe.config_snapshot or current)["data"]["path"]
    configs = configs_of(current, edits)
    if m < len(edits) and any("saved" not in e for e in edits[:m + 1]):
        first = next(i for i, e in enumerate(edits) if "saved" not in e)
        raise StateError(f"this step is before mixture edit {first + 1} of this run, which a babelfeed older than "
                         f"this one recorded without the saved run's weights and position: trace it with the config "
                         f"and a state from before that edit")

    def history(i: int) -> tuple[list, object]:  # the weights and update counts of segment i
        if i < len(edits):
            saved = edits[i]["saved"]
            return saved.get("weights", []), saved.get("updates")
        return views.weights, views.updates

    if any("saved" not in e for e in edits[:m]):  # an older state, and a step after its last edit
        it = _build(configs[-1], data_path, world, split, probe)
        it.set_state(state, mixture_change="allow")
        it._legacy_from = int(state["epoch"])  # epochs before the state's are not known: refused
        return it
    it = _build(configs[0], data_path, world, split, probe)
    _apply_history(it, *history(0))
    for i in range(m):
        edit = edits[i]
        old = it
        it = _build(configs[i + 1], data_path, world, split, old)
        if "saved_at_step" in edit:  # babelfeed 0.1's: the saved window finished, the edit began the next epoch
            e = int(edit["saved"]["epoch"])
            part = old.planner.handoff(e, old.planner.window_end(e, int(edit["saved"]["consumed"])))
            it.planner.begin(Part(e + 1, 0, -1, 0.0, part.positions, part.served, batches=part.batches))
            it._seek(e + 1, 0, int(edit["step"]))
        else:
            old._seek(int(edit["epoch"]), int(edit["batch"]), int(edit["step"]))
            it.continue_from(old, quiet=True)
        _apply_history(it, *history(i + 1))
    return it


def step_batch(probe, step: int, state: dict, rank: int | None = None) -> dict:
    """Rank ``rank``'s batch of training step ``step`` of the run whose latest state is ``state``, as the run
    served it: the plan in force then (:func:`step_source`), with the skips made by then. ``rank``: of the world
    size that took the step (None: the probe's rank); with ``split="rows"``, its block of that many equal row
    blocks."""
    src = step_source(probe, step, state)
    world = src.world_size
    rank = probe.rank if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise UsageError(f"rank must be an integer in [0, {world}): step {step} was taken on {world} rank(s), got "
                         f"{rank!r}")

    return _rank_batch(src, Skips(_views(state).skips), rank)


def _rank_batch(src: StepSource, skips, rank: int) -> dict:
    """Rank ``rank``'s batch of the step ``src`` locates, with the run's ``skips`` (a ``Skips``)."""
    it = src.it
    served = it
    g = src.g0 + (rank if it.split == "batches" else 0)
    saved = (served.epoch, served.skips, served.row_blocks, served._fillers)
    try:
        served.epoch, served.skips, served._fillers = src.epoch, skips, {}
        if it.split == "rows":
            served.row_blocks = ((rank,), src.world_size)
        where = served.planner.locate(src.epoch, g)
        return served._dummy() if where is None else served._collate_one(*where)
    finally:
        served.epoch, served.skips, served.row_blocks, served._fillers = saved


def row_ranks(src: StepSource, skips) -> dict:
    """``split="rows"``: ``{sample id: rank}`` of the step's samples, the rank whose row block served each (the
    global batch is ordered before it is cut into the ranks' blocks, so the plan alone does not say). Every rank's
    block is gathered once: together, one global batch."""
    out: dict = {}
    for rank in range(src.world_size):
        batch = _rank_batch(src, skips, rank)
        for i, w in zip(np.asarray(batch["id"]).tolist(), np.asarray(batch["weight"]).tolist()):
            if w > 0:
                out[int(i)] = rank
    return out


def _rebuild(probe, world: int, split: str | None = None):
    split = split or probe.split
    config = getattr(probe, "source_config", None)
    if config is None:
        raise UsageError(f"this iterator was not built from a config (build_train_iterator): trace steps taken on "
                         f"{world} rank(s) (split={split!r}) with an iterator of that world size and split")
    return probe.build_another(config, world_size=world, split=split)


# (trace walks the plan of every epoch before a step's: protocol.MAX_EPOCHS_AHEAD bounds it)


def _locate(it, step: int, segments: list, edit: dict | None, world: int) -> StepSource:
    """Count ``step`` from the latest point where the count is known, with ``it`` the plan in force."""
    per = it.batches_per_step
    planner = it.planner
    if edit is not None:  # (babelfeed 0.1's edits began an epoch)
        first, epoch, consumed = edit["step"] + 1, int(edit["epoch"]), int(edit.get("batch", 0))
    else:
        first, epoch, consumed = 1, 1, 0
    for start, e, c, _ws in segments:  # a resume on another world size after it: counted from there
        if first - 1 < start < step:
            first, epoch, consumed = start + 1, int(e), int(c)

    def steps_in(epoch: int, consumed: int = 0) -> int:
        return -(-(planner.num_batches(epoch) - consumed) // per)

    from tqdm.auto import tqdm  # loaded when a bar is drawn (tqdm.auto probes for notebooks)

    ahead = (step - first) // max(steps_in(epoch), 1)  # epochs to plan before the step's (about: epochs vary)
    if ahead > MAX_EPOCHS_AHEAD:
        raise StateError(f"step {step:,} lies about {ahead:,} epochs after step {first:,} (epoch {epoch}, "
                         f"{steps_in(epoch):,} steps long): trace plans every epoch before a step's, and refuses "
                         f"steps more than {MAX_EPOCHS_AHEAD:,} epochs ahead")
    bar, walked = None, 0  # a step many epochs on plans every epoch before it (integers only): say so
    while step >= first + steps_in(epoch, consumed):
        first += steps_in(epoch, consumed)
        epoch, consumed = epoch + 1, 0
        walked += 1
        if bar is None and walked >= 50:
            bar = tqdm(desc=f"planning epochs up to step {step:,}", unit="epoch", total=ahead or None, initial=walked,
                       leave=False)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return StepSource(it, epoch, consumed + (step - first) * per, world)


def step_rows(src: StepSource, skips=None) -> list[tuple]:
    """Per global batch of the step: ``(rank or k, global batch, ids, src_len, tgt_len, dropped)`` of its
    planned samples, ids as the ranks received them; ``dropped``: which of them the run's ``skips`` (a
    :class:`~babelfeed.run.skips.Skips`) left out of the batch (None: none)."""
    it = src.it
    out = []
    for k in range(it.batches_per_step):
        g = src.g0 + k
        planner, collater = it.planner, it.collater
        where = planner.locate(src.epoch, g)
        if where is None:  # the epoch's last step: this rank's batch is an epoch-padding one
            continue
        w, j = where
        win = planner.window(src.epoch, w)
        rows = win.batch_rows(np.array([j]))
        s = win.samples
        ids = collater.ids(s.comp[rows].astype(np.int64), s.local[rows])
        dropped = skips.dropped(planner.sources, src.epoch, g, s.comp[rows], s.local[rows]) if skips else None
        out.append((k, g, ids, s.src_len[rows], s.tgt_len[rows], dropped))
    return out
