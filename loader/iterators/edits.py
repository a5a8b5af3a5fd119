"""Mixture edits on resume: a run resumed with an edited config goes on where every stream stood.

With the stream sampler every stream (a task's corpus) is an endless sequence with a position, so a mixture can
change without losing or repeating a sample: streams on both sides continue from their positions, a new stream
starts at 0, a removed one keeps its position in the state (re-added later, it goes on from there). What must not
change is each kept stream's data (its files, hence its sequence) and the seed; everything else is a mixture
setting (task weights, temperature, schedule, filters, batching, prefixes, noise).

A state saved in the middle of a planning window has served part of that window's samples. The state carries
the config it was made with, so the resumed run first serves the rest of that window as it was planned (an
iterator of the saved config, on the same data), then ends the epoch there and goes on with the edited mixture
in the next epoch, from every stream's position at the window's end. (A stream sampler's epoch is a count of
samples, not a pass over data: ending one early loses nothing.) The edit is recorded in the state's ``edits``:
at which step and global batch, and which config values changed.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from babelfeed.iterators.ledger import FIELDS
from babelfeed.sources.sources import data_digest


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
        raise ValueError(f"iterator state field stream['data'] must map stream names to what they read, got "
                         f"{str(saved)[:200]}")
    if not isinstance(old_config.get("data"), dict) or "seed" not in old_config:
        raise ValueError("iterator state field 'config' is not a whole config of the run (its data section or seed "
                         "is missing): resume with the config it was saved with")
    seed = old_config.get("seed")
    if seed != new_planner.opts.seed:
        raise ValueError(f"the seed changed ({seed} -> {new_planner.opts.seed}): every stream's order would "
                         f"change, so no stream could go on where it stood; keep the seed")
    split = old_config.get("data", {}).get("train_split")
    if split != new_planner.sources.split:
        raise ValueError(f"the training split changed ({split} -> {new_planner.sources.split})")
    new = stream_identities(new_planner)
    changed = sorted(k for k in set(saved) & set(new) if saved[k] != new[k])
    if changed:
        raise ValueError(f"the data of stream(s) {changed[:5]} changed (another corpus, tokenizer or shard files "
                         f"under the same name): they cannot go on where they stood. Give changed data a new stream "
                         f"name (a task of its own) and keep the old name for the old data")


class Handover:
    """The rest of the saved run's window in progress, served by an iterator of the saved config until global
    batch ``end`` of ``epoch``; its batches' ``direction`` and ``id`` are renumbered into the edited run's
    streams and ids (a stream the edit removed: direction -1, ids after this data's, which ``describe_ids``
    still names)."""

    def __init__(self, old, epoch: int, end: int, state: dict, new_it):
        self.old, self.epoch, self.end, self.state = old, epoch, end, state
        new_keys = {k: i for i, k in enumerate(new_it.planner.keys)}
        self.direction = np.array([new_keys.get(k, -1) for k in old.planner.keys], np.int64)
        new_comp = {(c.key, c.shard): i for i, c in enumerate(new_it.planner.sources.components)}
        old_comps = old.planner.sources.components
        self.comp_map = np.array([new_comp.get((c.key, c.shard), -1) for c in old_comps], np.int64)
        self.old_base = old.collater.id_base
        self.new_base = new_it.collater.id_base
        self.new_keys = new_it.planner.keys
        self.removed = [i for i, k in enumerate(old.planner.keys) if k not in new_keys]

    def batch(self, g: int, base: int) -> dict:
        old = self.old
        if g < self.end:
            batch = old.batch_at(0, base=base)
        else:  # past the window's end on this step: an epoch-padding batch, as at an epoch's end
            batch = old._dummy()
        d = np.asarray(batch["direction"])
        batch["direction"] = np.where(d >= 0, self.direction[np.maximum(d, 0)], -1).astype(d.dtype)
        ids = np.asarray(batch["id"], np.int64)
        batch["id"] = self.map_ids(ids).astype(batch["id"].dtype)
        return batch

    def map_ids(self, ids) -> np.ndarray:
        """Ids of the saved run's data as the edited run numbers them (a stream the edit removed: after this
        data's ids, which ``describe_ids`` still names; -1 stays -1)."""
        ids = np.asarray(ids, np.int64)
        comp = np.searchsorted(self.old_base, ids, side="right") - 1
        new = self.comp_map[np.clip(comp, 0, len(self.comp_map) - 1)]
        local = ids - self.old_base[np.clip(comp, 0, len(self.old_base) - 1)]
        return np.where(ids < 0, -1, np.where(new >= 0, self.new_base[np.maximum(new, 0)] + local,
                                              int(self.new_base[-1]) + ids))

    def totals(self, consumed: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The ledger's totals at ``consumed`` of the epoch, in the edited run's streams, then the streams the
        edit removed (which still serve until the window ends); and the same of the rows the skips dropped
        (None: none)."""
        _, old_totals, _, old_skipped = self.old.ledger_totals(self.epoch, consumed)

        def mapped(t):
            return np.concatenate([map_totals(t, self.old.planner.keys, self.new_keys), t[:, self.removed]], axis=1)

        return mapped(old_totals), None if old_skipped is None else mapped(old_skipped)


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
