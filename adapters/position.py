"""A loader's position in its run, kept in the training process: what the torch ``BatchLoader`` and
``BatchDataset`` and grain's ``EpochsDataset`` save and restore.

A loader counts the global batches of the epoch that every rank together has taken (``consumed``): global
batches never depend on the world size, the split or the number of workers, so a position restores on any of
them. What a loader saves is the run's whole iterator state at that position (``babelfeed.iterators.state``), the same
dict ``get_state()`` gives in-process; it also reads an older babelfeed's bare position (``{"epoch",
"consumed", "fingerprint"}``) and the per-worker positions inside a torchdata ``StatefulDataLoader`` checkpoint.
"""

from __future__ import annotations

from babelfeed.errors import DataChangedError, StateError
from babelfeed.build import build_iterator
from babelfeed.iterators.protocol import identity_changes
from babelfeed.iterators.state import (_int, check_position, find_state,  # noqa: F401  (part of this module's face)
                                       is_iterator_state)
from babelfeed.storage.stamps import replaced


def resumed_iterator(config, rank: int, world_size: int, split, epoch: int, resume: dict | None = None,
                     expect: dict | None = None):
    """An iterator of ``config`` in ``epoch``: built, and where the run was resumed from ``resume``, given that
    state first, so the run's history (weight changes, edits, world sizes) plans the same batches. What a loader
    opens in each process that gathers (DataLoader and grain workers) and keeps in the training process.
    ``expect``: ``{"fingerprint", "identity"}`` of the data the loader started with (:func:`pinned`): a worker
    that finds other data (replaced under the running job) refuses, naming what changed."""
    it = build_iterator(config, rank=rank, world_size=world_size, split=split, **({} if resume else {"epoch": epoch}))
    if expect is not None and it.fingerprint() != expect["fingerprint"]:
        what = "; ".join(identity_changes(expect.get("identity"), it.identity())) or "its fingerprint"
        raise DataChangedError(None, f"the data this job reads changed while it ran ({what}): a process opening it "
                                     f"anew found other files than the job started with (a data folder renamed into "
                                     f"place, binarize --overwrite?). Restart from the last saved state")
    if expect is not None and expect.get("files"):
        for path, now in _files(it).items():
            was = expect["files"].get(path)
            if was is not None and replaced(was, now):
                raise DataChangedError(path, "replaced since the job started (a data folder renamed into place, "
                                             "binarize --overwrite?): a process opening it anew found another file "
                                             "there, and would read other data than the job's plan, though its "
                                             "sizes match. Restart from the last saved state")
    if resume is None:
        return it
    it.set_state(resume)
    if it.position()[0] != epoch:
        it._seek(epoch, 0, 0)
    return it


def pinned(it) -> dict:
    """What a loader's worker processes must find when they open the data (``resumed_iterator``'s expect): its
    fingerprint (from the indexes: the same data anywhere) and, on this host, the very files (a file renamed over
    another with the same sizes, binarized again with another dictionary, has the fingerprint of the old one)."""
    return {"fingerprint": it.fingerprint(), "identity": it.identity(), "files": _files(it)}


def _files(it) -> dict:
    """``{path: [device, inode]}`` of the ``.idx`` and ``.bin`` files the iterator ``it`` opened."""
    out = {}
    for ds in it.datasets():
        ids = getattr(ds, "_ids", None)
        if ids is not None:
            out[ds.index_file], out[ds.data_file] = ids[0][:2], ids[1][:2]
    return out


class Position:
    """Where a rank's loader stands in its run, kept in the training process: ``(epoch, consumed)`` with
    ``consumed`` the global batches of the epoch that every rank together has taken. Global batches never depend
    on the world size, so the position restores on any world size and ``split``, with any number of workers.

    It keeps one iterator of the run, which holds the run's history from the state it was loaded from (weight
    changes, world sizes, edits), so :meth:`state` is the whole iterator state at a position: the same state
    ``get_state()`` gives in-process, which every adapter and ``babelfeed trace`` take. Steps are counted on this
    world size from the state loaded (or the run's start)."""

    def __init__(self, config, rank, world_size, split, what: str):
        self.config, self.rank, self.world_size, self.split, self.what = config, rank, world_size, split, what
        self._it = None
        self.resume: dict | None = None  # the state loaded (workers rebuild the run's history from it)
        self.anchor = (1, 0, 0)  # (epoch, consumed, total_steps) where the step count is known

    def iterator(self, epoch: int):
        """The run's iterator, standing in ``epoch`` (for ``has_batch``, ``len``, ...): at its start, or, in the
        epoch of a mixture edit, at the edit (the first batch the edited plan holds)."""
        if self._it is None:
            self._it = resumed_iterator(self.config, self.rank, self.world_size, self.split, epoch, self.resume)
        if self._it.position()[0] != epoch:
            first = self.first_batch(epoch)
            self._it._seek(epoch, first, self.total_at(epoch, first))
        return self._it

    def current(self):
        """The run's iterator where it stands, for what does not depend on the epoch (its kind, fingerprint, data,
        batches per step): built at the position loaded, never moved."""
        if self._it is None:
            self._it = resumed_iterator(self.config, self.rank, self.world_size, self.split, self.anchor[0],
                                        self.resume)
        return self._it

    def first_batch(self, epoch: int) -> int:
        """The first global batch of ``epoch`` this run's plan holds: 0, or where a mixture edit began."""
        part = getattr(getattr(self.current(), "planner", None), "part", None)
        return int(part.batch) if part is not None and part.epoch == epoch else 0

    @property
    def is_lm(self) -> bool:
        return self.current().kind == "lm"

    def total_at(self, epoch: int, consumed: int) -> int:
        """The run's steps at a position: counted on this world size from the state loaded (or the run's start)."""
        e0, c0, t0 = self.anchor
        it = self.current()
        if (epoch, consumed) >= (e0, c0):
            return t0 + it.steps_between((e0, c0), (epoch, consumed))
        return max(0, t0 - it.steps_between((epoch, consumed), (e0, c0)))

    def state(self, epoch: int, consumed: int) -> dict:
        """The run's whole state at a position (``get_state()`` there): a finished translation epoch is written as
        the start of the next (an LM run is one pass: its end stays its end)."""
        it = self.iterator(epoch)
        if self.is_lm:
            consumed = min(consumed, len(it))
        return it.state_at(epoch, consumed, self.total_at(epoch, consumed))

    def load(self, state, mixture_change: str = "refuse") -> tuple[int, int]:
        """Take a saved state (any adapter's, an older babelfeed's position, a StatefulDataLoader checkpoint:
        ``babelfeed.iterators.state.find_state``); returns the position it holds. ``mixture_change="allow"``: a state of
        another config of the same data (an edited mixture) goes on under this config from its next step; the
        edited run's state is what the workers then load."""
        found = find_state(state, f"{self.what} state")
        it = self.iterator(1) if self._it is None else self._it
        if is_iterator_state(found):
            it.last_edit = None
            it.set_state(found, mixture_change=mixture_change)
            epoch, consumed = it.position()
            total = it.total_steps
            full = found if it.last_edit is None else it.get_state()  # (an edit: the edited run's state)
        else:
            self._check_schedule(found, it)
            epoch, consumed, total = it.load_position(found, self.what)  # (checked there)
            if self.is_lm and epoch != 1:
                raise StateError(f"{self.what} state: an LM run is one pass (epoch 1), this state has epoch {epoch}")
            if consumed > it.epoch_batches(epoch):
                raise StateError(f"{self.what} state: consumed={consumed} is past the end of epoch {epoch}, which has "
                                 f"{it.epoch_batches(epoch)} global batches")
            full = it.state_at(epoch, consumed, total)
            it.set_state(full)
        self.resume, self.anchor = full, (epoch, consumed, total)
        return epoch, consumed

    def _check_schedule(self, found: dict, it) -> None:
        planner = getattr(it, "planner", None)
        if planner is not None and planner.changing_schedule:
            per = found.get("batches_per_update", planner.opts.batches_per_update)
            if per != planner.opts.batches_per_update:
                raise StateError(f"{self.what} state: saved where an optimizer update was {per} global batches (world "
                                 f"size x accumulation), here {planner.opts.batches_per_update}; this older position "
                                 f"does not record how updates were counted, so it resumes a mixing schedule only "
                                 f"with the same count. States saved by this babelfeed resume it on any world size")

    def adopt_edits(self, loader) -> None:
        """After a change made through this position (``apply``, ``load``): where the run's config is another now
        (an edit; the weights ``set_weights`` set), the loader and this position build from it, and the data its
        workers must find is the run's."""
        it = self._it
        if it is None or it.source_config is None or it.source_config is self.config:
            return
        self.config = loader.config = it.source_config
        loader._expect = pinned(it)

    def apply(self, epoch: int, consumed: int, method: str, *args, **kwargs) -> tuple[dict, object]:
        """The run's iterator's ``method`` (``skip``, ``set_weights``, ``edit``) called at this position: the
        run's state afterwards (for the loader to load) and what the method returned."""
        state = self.state(epoch, consumed)
        it = self.iterator(epoch)
        it.set_state(state)
        out = getattr(it, method)(*args, **kwargs)
        return it.get_state(), out

    def ledger(self, epoch: int, consumed: int, prefix: str = "ledger") -> dict:
        """The run's ledger (``babelfeed.iterators.ledger``) at this position: what every rank together has consumed, per
        stream (an LM run: per blended dataset), since training began, counted from the plan."""
        it = self.iterator(epoch)
        if it.kind == "lm":
            return it.ledger(prefix, at=consumed)
        e, totals, _, skipped = it.ledger_totals(epoch, consumed)
        return it.ledger(prefix, at=(e, totals, self.total_at(epoch, consumed), skipped))
