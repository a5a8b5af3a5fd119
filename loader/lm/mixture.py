"""An LM run's blend over time: the weights it started with, ``set_weights`` and mixture edits on resume.

A run's samples are blended segment by segment. A segment starts at global sample ``sample`` with weights per
dataset and, per dataset, how many of its samples the run had taken before (``offsets``); inside it, Megatron's
greedy blend over the segment's datasets decides which dataset gives each sample, and a dataset's k-th sample
there is its ``offsets + k``-th sample. So a weight change, a dataset added or a dataset removed never repeats or
skips a dataset's sample: per dataset, the samples served over the whole run are its own sequence.

Segments are the state's ``blend`` history events (``babelfeed.run.history``):
``{"event": "blend", "sample", "weights": {key: w}, "offsets": {key: n}, "names": {key: name}}`` (and
``"changes"`` for an edit), datasets named by their data key (a digest of their content, so the same files
under another path are the same dataset). ``offsets`` also carries datasets no longer blended, so one that is
added back goes on where it stopped. With no events, the run blends its config's weights from sample 0.
"""

from __future__ import annotations

import numpy as np

from babelfeed.errors import HistoryError
from babelfeed.lm.blending import blending_indices


def first_event(keys: list, weights: list, names: list) -> dict:
    """The segment a run starts with: its config's weights from sample 0."""
    return {"event": "blend", "sample": 0, "weights": {k: float(w) for k, w in zip(keys, weights)},
            "offsets": {k: 0 for k in keys}, "names": dict(zip(keys, names))}


def _blend(event: dict, size: int) -> tuple[list, np.ndarray, np.ndarray]:
    """Megatron's greedy blend of the event's datasets over ``size`` samples. After the first segment (the
    config's own weights, blended as Megatron blends them: a weight-0 dataset can give the first sample), a
    dataset given weight 0 is left out: it serves nothing."""
    keys = [x for x in event["weights"] if event["sample"] == 0 or event["weights"][x] > 0]
    d, k = blending_indices([event["weights"][x] for x in keys], size)
    return keys, d, k


def check_offsets(events: list) -> None:
    """Each event's offsets are what the events before it took from every dataset (the first's all 0): an edited
    offset would skip or repeat a dataset's samples (or, far off, plan epochs without end)."""
    for i, e in enumerate(events):
        want = offsets_at(events[:i], e["sample"]) if i else {}
        got = {k: v for k, v in e["offsets"].items() if v or want.get(k)}
        want = {k: v for k, v in want.items() if v}
        if got != want:
            bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))[:3]
            raise HistoryError(f"iterator state field 'history': blend event {i} (sample {e['sample']}) says "
                               f"{[(e['names'].get(k, k), got.get(k, 0)) for k in bad]} samples were taken from "
                               f"those datasets before it; the events before it took {[want.get(k, 0) for k in bad]}")


def offsets_at(events: list, sample: int) -> dict:
    """Per data key, the samples the run had taken from that dataset before global sample ``sample``."""
    last = max((e for e in events if e["sample"] <= sample), key=lambda e: e["sample"])
    out = {k: int(v) for k, v in last["offsets"].items()}
    n = sample - last["sample"]
    if n > 0:
        keys, d, _ = _blend(last, n)
        for i, c in enumerate(np.bincount(d.astype(np.int64), minlength=len(keys)).tolist()):
            out[keys[i]] = out.get(keys[i], 0) + int(c)
    return out


def arrays(events: list, size: int, index_of: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset int16[size], sample int64[size])`` of the run's first ``size`` global samples: per sample, the
    index (in ``index_of``: data key -> this iterator's dataset, -1 where it has none of that data) of the dataset
    that gives it and which of that dataset's samples it is."""
    dataset = np.empty(size, np.int16)
    sample = np.empty(size, np.int64)
    events = sorted(events, key=lambda e: e["sample"])
    for i, e in enumerate(events):
        lo = min(e["sample"], size)
        hi = min(events[i + 1]["sample"], size) if i + 1 < len(events) else size
        if hi <= lo:
            continue
        keys, d, k = _blend(e, hi - lo)
        local = np.array([index_of.get(x, -1) for x in keys], np.int16)
        offs = np.array([int(e["offsets"].get(x, 0)) for x in keys], np.int64)
        dataset[lo:hi] = local[d]
        sample[lo:hi] = offs[d] + k
    return dataset, sample


def add(events: list, event: dict) -> list:
    """``events`` with ``event`` appended: a change at the same sample as the last one replaces it."""
    out = [e for e in events if e["sample"] < event["sample"]]
    return out + [event]
