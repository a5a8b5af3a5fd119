"""One state for every way of running babelfeed: the iterator's state, wherever it was saved.

The state of a run is its iterator's ``get_state()``: version, kind, name, fingerprint, the position (``epoch``,
``consumed`` global batches of the epoch, ``total_steps``) and the run's history (world sizes, weight changes,
edits, the ledger, where the streams stood). Every adapter saves that same dict at the position its consumer
has reached: the in-process iterator, ``TorchBatches`` and the JAX prefetcher, the torch ``BatchLoader`` and
``BatchDataset``, grain's ``EpochsDataset``, the Hugging Face Trainer. So a checkpoint of any of them restores
under any other, and ``babelfeed trace --state`` reads it.

Some checkpoints hold the state inside something else: ``{"data": state}`` (a training script's checkpoint),
torchdata's ``StatefulDataLoader`` (its ``state_dict()`` keeps our dataset's state per worker), an older
babelfeed's loader position (``{"epoch", "consumed", "fingerprint"}``, no history). :func:`find_state` digs the
state out of any of them; :func:`resolve` turns what it found into a whole iterator state, with an iterator of
the run's config to count the steps a bare position leaves out.
"""

from __future__ import annotations

from babelfeed.errors import StateError

POSITION_KEYS = {"epoch", "consumed", "fingerprint"}


POSITION_OPTIONAL = {"batches_per_update", "total_steps", "base", "worker", "world_size"}
# fields only an iterator state has: a dict with any of them is checked as one (and its faults named)
ITERATOR_KEYS = {"version", "kind", "name", "total_steps", "consumed_samples", "history", "steps", "ledger", "stream"}


def is_iterator_state(obj) -> bool:
    """An iterator's ``get_state()`` (translation or LM)."""
    return isinstance(obj, dict) and "version" in obj and ("consumed" in obj or "consumed_samples" in obj)


def is_position(obj) -> bool:
    """A loader position: an older babelfeed's ``{"epoch", "consumed", "fingerprint"}``, or a worker's position
    inside a ``StatefulDataLoader`` checkpoint (which also names the state it counts from)."""
    return (isinstance(obj, dict) and "version" not in obj and POSITION_KEYS <= set(obj)
            and set(obj) <= POSITION_KEYS | POSITION_OPTIONAL)


def needs_resolving(obj) -> bool:
    """Whether ``set_state`` should look for the state inside ``obj`` (a loader position or a checkpoint holding
    one) rather than check it as an iterator state (whose missing or bad fields are then named)."""
    return isinstance(obj, dict) and (is_position(obj) or not (ITERATOR_KEYS & set(obj)))


def _candidates(obj, depth: int = 0) -> list:
    if depth > 6:
        return []
    if is_iterator_state(obj) or is_position(obj):
        return [obj]
    out: list = []
    if isinstance(obj, dict):
        for v in obj.values():
            out += _candidates(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            out += _candidates(v, depth + 1)
    return out


def find_state(checkpoint, what: str = "checkpoint") -> dict:
    """The babelfeed state inside ``checkpoint``: a state itself, a dict holding one (``{"data": state}``), or a
    ``StatefulDataLoader.state_dict()`` (the position of the worker that handed out the last batch is the
    loader's). Raises StateError, naming what was found, when there is none or more than one."""
    if is_iterator_state(checkpoint) or is_position(checkpoint):
        return checkpoint
    if not isinstance(checkpoint, (dict, list, tuple)):
        hint = " (a JSON string? json.loads it first)" if isinstance(checkpoint, (str, bytes)) else ""
        raise StateError(f"a babelfeed state is a dict (an iterator's get_state(), a loader's state_dict()), got "
                         f"{type(checkpoint).__name__}{hint}")
    if isinstance(checkpoint, dict) and checkpoint.get("_steps_since_snapshot"):
        raise StateError(f"this StatefulDataLoader {what} was taken {checkpoint['_steps_since_snapshot']} batches after "
                         f"its last snapshot: create the loader with snapshot_every_n_steps=1 (the default) so its "
                         f"state is the position of the last batch handed out")
    found = _candidates(checkpoint)
    workers = [s for s in found if isinstance(s.get("worker"), dict)]
    if workers and len(workers) == len(found):
        # a StatefulDataLoader's per-worker positions: the loop has received every batch up to the latest one
        # any worker handed out, so that worker's position is the loader's
        return max(workers, key=lambda s: (s["epoch"], s["consumed"]))
    if len(found) == 1:
        return found[0]
    keys = sorted(checkpoint)[:12] if isinstance(checkpoint, dict) else f"a {type(checkpoint).__name__}"
    if not found:
        grain = isinstance(checkpoint, dict) and any("next_index" in str(k) or "workers_state" in str(k)
                                                    for k in checkpoint)
        raise StateError(f"this {what} holds no babelfeed state (it has {keys})"
                         + ("; it looks like grain's own mp_prefetch state, which counts batches per worker of one "
                            "epoch: save EpochsDataset's iterator state instead, which any adapter restores"
                            if grain else ""))
    raise StateError(f"this {what} holds {len(found)} babelfeed states (it has {keys}); pass the one to resume from")


def resolve(checkpoint, it, what: str = "checkpoint") -> dict:
    """The whole iterator state of ``checkpoint`` (see :func:`find_state`) for iterator ``it`` of the run's
    config: a position (an older babelfeed's, or a worker's) becomes the state of the run at that position,
    counting its steps on ``it``'s world size from the state it names (or the run's start). ``it`` is moved."""
    state = find_state(checkpoint, what)
    if is_iterator_state(state):
        return state
    epoch, consumed, total = it.load_position(state, what)
    return it.state_at(epoch, consumed, total)


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_position(state, what: str) -> tuple[int, int]:
    """``(epoch, consumed)`` of a saved loader position, refusing what is not one (named in the error)."""
    if not isinstance(state, dict) or not {"epoch", "consumed", "fingerprint"} <= set(state):
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise StateError(f"not a {what} state (it has epoch, consumed, fingerprint; this has {keys})"
                         + (": states saved before consumed replaced batches_seen cannot be converted safely"
                            if isinstance(state, dict) and "batches_seen" in state else ""))
    epoch, consumed = state["epoch"], state["consumed"]
    if not (_int(epoch) and 1 <= epoch < 1 << 31 and _int(consumed) and consumed >= 0):
        raise StateError(f"{what} state: epoch must be an int in [1, 2**31) and consumed an int >= 0, got "
                         f"epoch={epoch!r}, consumed={consumed!r}")
    if not isinstance(state["fingerprint"], str):
        raise StateError(f"{what} state: fingerprint must be a string, got {state['fingerprint']!r}")
    return epoch, consumed
