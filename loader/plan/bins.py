"""Dynamic length bins as a batch sampler for torch's DataLoader and the Hugging Face Trainer.

Samples are split into length bins, each bin has its own batch size, bins are drawn in proportion to their
size, and every sample of a bin is seen before the bin reshuffles. The bins are a shape plan
(:mod:`babelfeed.plan.shapes`): quarters of the maximum length (``bins="quarters"``: edges L/4, L/2, 3L/4, L),
or the padding-optimal K edges (``bins=K``); a bin's batch size is the token budget over its edge, so every
batch of a bin has the same padded size.

An epoch is every sample once. Its batches are interleaved by drawing bins in proportion to the batches they
have left, so all bins run out together; ``len()`` is exact. Rank r of W takes batches r, r + W, ...; when the
count is not a multiple of W the list wraps around (the first batches are repeated), as torch's
DistributedSampler pads, so every rank takes the same number of steps.

    sampler = LengthBinSampler(lengths, max_tokens=8192, bins=8, seed=0)
    dl = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(dl, 1):
            ...
            state = sampler.state_dict(step)   # the batches received so far, whatever num_workers
    # resume: sampler.load_state_dict(state) on a fresh sampler, then iterate the DataLoader again

With the Hugging Face Trainer, return such a DataLoader from an overridden ``get_train_dataloader``.
"""

from __future__ import annotations

import numpy as np

from babelfeed.checks import check_rank
from babelfeed.plan.shapes import ShapePlan, plan_shapes, shapes_from_widths
from babelfeed.errors import DataError, StateError, UsageError, UsageTypeError


class LengthBinSampler:
    """Yields lists of sample indices; every index once per epoch (plus wrap-around padding across ranks)."""

    def __init__(self, lengths, max_tokens: int, bins="quarters", max_length: int | None = None, multiple: int = 1,
                 max_sentences: int | None = None, seed: int = 0, drop_last: bool = False, rank: int = 0,
                 world_size: int = 1):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.ndim != 1 or not len(self.lengths):
            raise UsageError("lengths must be a non-empty 1-D array")
        check_rank(rank, world_size)
        longest = int(max_length or self.lengths.max())
        if self.lengths.max() > longest:
            raise DataError(f"a sample of {int(self.lengths.max())} tokens is longer than max_length={longest}")
        if bins == "quarters":
            edges = sorted({max(1, -(-longest * q // 4)) for q in (1, 2, 3, 4)})
            self.plan: ShapePlan = shapes_from_widths(edges, self.lengths, max_tokens, multiple, max_sentences)
        elif isinstance(bins, int):
            self.plan = plan_shapes(self.lengths, bins, max_tokens, multiple, max_sentences, windows=0)  # no masked rows
        else:
            self.plan = shapes_from_widths(list(bins), self.lengths, max_tokens, multiple, max_sentences)
        self.bin_of = self.plan.bucket(self.lengths)
        self.members = [np.flatnonzero(self.bin_of == k) for k in range(self.plan.num_shapes)]
        self.seed, self.drop_last = seed, drop_last
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._skip = 0  # the next batch the sampler yields
        self._start = 0  # the first batch of the current (or next) iteration

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._skip = self._start = 0

    def _global_batches(self) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, self.epoch])
        per_bin = []
        for k, idx in enumerate(self.members):
            b = int(self.plan.batch_sizes[k])
            shuffled = rng.permutation(idx)
            cuts = [shuffled[i:i + b] for i in range(0, len(shuffled), b)]
            if self.drop_last and cuts and len(cuts[-1]) < b:
                cuts.pop()
            per_bin.append(cuts)
        left = np.array([len(c) for c in per_bin], dtype=np.int64)
        pos = [0] * len(per_bin)
        out = []
        while left.sum():
            k = int(rng.choice(len(left), p=left / left.sum()))  # in proportion to what each bin has left
            out.append(per_bin[k][pos[k]])
            pos[k] += 1
            left[k] -= 1
        return out

    def _rank_batches(self) -> list[np.ndarray]:
        batches = self._global_batches()
        if not batches:
            return []
        pad = (-len(batches)) % self.world_size
        batches = batches + [batches[i % len(batches)] for i in range(pad)]
        return batches[self.rank::self.world_size]

    def __len__(self) -> int:
        n = sum(-(-len(m) // int(b)) if not self.drop_last else len(m) // int(b)
                for m, b in zip(self.members, self.plan.batch_sizes))
        return -(-n // self.world_size)

    def __iter__(self):
        start = self._skip  # where this iteration begins (a resumed position, else 0), fixed now: a DataLoader
        self._start = start  # asks for the iterator before its workers prefetch index lists
        return self._batches(start)

    def _batches(self, start: int):
        for i, batch in enumerate(self._rank_batches()):
            if i < start:
                continue
            self._skip = i + 1
            yield batch.tolist()
        self._skip = 0

    def state_dict(self, batches_seen: int | None = None) -> dict:
        """{"epoch", "batches_done"} after the training loop has received ``batches_seen`` batches of this
        iteration over the DataLoader; restore with ``load_state_dict`` to continue with the next batch.

        The count must come from the loop: a DataLoader with workers takes index lists from the sampler ahead of
        the batches it hands out (``prefetch_factor * num_workers`` of them), so what the sampler has yielded is
        not what training has seen.
        """
        if batches_seen is None:
            raise UsageTypeError("LengthBinSampler.state_dict(batches_seen): pass the number of batches the training "
                                 "loop received from the DataLoader in this iteration; the sampler alone cannot tell, "
                                 "since DataLoader workers take index lists ahead of the batches handed out")
        seen = int(batches_seen)
        if not 0 <= seen <= len(self) - self._start:
            raise UsageError(f"batches_seen={batches_seen} is outside 0..{len(self) - self._start}: this "
                             f"iteration has {len(self) - self._start} batches")
        return {"epoch": self.epoch, "batches_done": self._start + seen}

    def load_state_dict(self, state: dict) -> None:
        """Continue after ``state`` (from ``state_dict``). This sampler orders a dataset of the user's own, so its
        state is its own: an epoch and the batches done in it (a babelfeed iterator's state is refused by name)."""
        if isinstance(state, dict) and ("version" in state or "consumed" in state or "consumed_samples" in state):
            raise StateError("this is a babelfeed iterator's state (a BatchIterator's, a loader's); a LengthBinSampler "
                             "resumes from its own state_dict(batches_seen): {'epoch', 'batches_done'}")
        ok = (isinstance(state, dict) and set(state) == {"epoch", "batches_done"}
              and all(isinstance(state[k], int) and not isinstance(state[k], bool) for k in state)
              and state["epoch"] >= 0 and 0 <= state["batches_done"] <= len(self))
        if not ok:
            raise StateError(f"a LengthBinSampler state is {{'epoch': int >= 0, 'batches_done': int in 0..{len(self)}}} "
                             f"(from state_dict(batches_seen)), got {str(state)[:200]}")
        self.epoch = state["epoch"]
        self._skip = state["batches_done"]
        self._start = self._skip
