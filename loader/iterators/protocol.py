"""What a babelfeed iterator is: one protocol for the translation and the language-model iterators.

An iterator serves one rank's batches (dicts of numpy arrays) and is fully described by a handful of integers:

* ``next(it)`` -> this rank's next batch; ``StopIteration`` at the end of an epoch. A translation iterator then
  starts its next epoch with the next call, so ``for epoch ...: for batch in it`` walks epoch after epoch; an LM
  iterator is one pass over its ``num_samples`` (each dataset's epochs happen inside it) and stays exhausted;
* ``len(it)`` -> this rank's steps in the current epoch; ``it.batch_at(k)`` -> this rank's k-th batch of the
  current epoch by random access, without moving (worker pools: grain, DataLoader workers); ``it.has_batch(k)``
  whether it exists. Neither needs ``len``: they plan only the windows up to batch k (``len`` of a translation
  epoch plans every window). Both take ``base=``: count k from global batch ``base`` of the epoch instead of its
  start (a position saved at another world size); ``it.batches_per_step`` is the global batches one step takes
  and ``it.steps_after(base)`` this rank's batches from there to the epoch's end;
* ``it.get_state()`` -> a small JSON-serialisable dict, the same on every rank at the same step;
  ``it.set_state(state)`` on a fresh iterator, in any process and on any world size, continues with the same
  global batches. The state names the iterator (``name``) and carries a ``fingerprint`` of the data and every
  setting that shapes the batches: a mismatch raises, unless ``mixture_change`` names what to do instead
  (:data:`MIXTURE_CHANGES`);
* ``rank``, ``world_size``, ``split`` (``"batches"``: whole batches per rank, torch DDP; ``"rows"``: every rank
  takes its rows of each global batch, JAX global arrays), ``epoch``.

The steering is declared here once, for both kinds: ``skip``, ``set_weights``, ``edit``, ``ledger``, ``trace``,
``describe_ids`` and ``batch_for_step``; each kind answers the part that depends on its plan (the ``_`` hooks).
What happened to a run (world sizes, weights, edits, skips, the ledger's counts) is its ``record``
(``babelfeed.run.record``), which composes the state.

Global batches never depend on the world size, so a job resumes elastically on another number of ranks.
An iterator plans its windows lazily and is not thread-safe: call it from one thread at a time (the grain
adapter's source serialises grain's read threads).
:class:`~babelfeed.iterators.translation.BatchIterator` (translation, ``build_train_iterator``) and
:class:`~babelfeed.lm.iterator.LMIterator` (language modelling) implement it; ``babelfeed.build_iterator(config, ...)`` builds
either from its config, and the JAX, torch and grain adapters take any of them.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import numpy as np

from babelfeed.checks import check_rank
from babelfeed.errors import StateMismatch, UsageError
from babelfeed.iterators.policy import scaled_weights
from babelfeed.iterators.state import check_position, needs_resolving, resolve
from babelfeed.run.edits import check_editable, check_sampler, config_changes, edited_config, snapshot
from babelfeed.run.history import upgrade
from babelfeed.run.record import (EDIT_HINT, MIXTURE_CHANGES, RunRecord, check_mixture_change,  # noqa: F401  (its face)
                                  identity_changes)
from babelfeed.run.skips import which_kind
from babelfeed.sources.corpus import reusing

from .fetch_ahead import FetchAhead


# Counting steps over epochs plans every epoch between (integers only; ~1,000 small epochs a second, a large
# corpus's epoch in seconds): a position or step further ahead than this is refused rather than planned for hours
MAX_EPOCHS_AHEAD = 10_000

class LoaderIterator(ABC):
    """Base of the iterators: the protocol (what each kind answers: the abstract methods), rank bookkeeping, the
    checks every ``set_state`` makes, and the steering, defined once for both kinds."""

    # How this iterator builds another of its run from a config (an edited resume rebuilds the saved run's, trace
    # and replay build the run's earlier parts, the loaders build the run's): the builder that built it
    # (babelfeed.build_iterator sets it on what it builds); None for an iterator not built from a config.
    rebuild = None

    def build_another(self, config, **kwargs):
        """An iterator of ``config`` built as this one was (:attr:`rebuild`)."""
        if self.rebuild is None:
            raise UsageError("this iterator was not built from a config (babelfeed.build_iterator): build the "
                             "run's iterators with it to edit, trace or replay a run")
        return self.rebuild(config, **kwargs)

    name: str = "train"
    kind: str = ""

    def __init__(self, rank: int, world_size: int, split: str, streams: int = 0):
        check_rank(rank, world_size)
        self.last_edit = None  # the report of the last mixture edit this iterator made (run.edits)
        self.config_snapshot: dict | None = None  # the config as JSON (set where it was built from one)
        self.source_config = None  # the config it was built from
        if split not in ("batches", "rows"):
            raise UsageError(f"split must be 'batches' or 'rows', got {split!r}")
        self.rank, self.world_size, self.split = rank, world_size, split
        # split="rows": which of how many equal row blocks of every global batch this rank gathers
        self.row_blocks: tuple = ((rank,), world_size)
        self.record = RunRecord(self.kind, self.name, world_size, split, streams)

    # ------------------------------------------------------------------------------------ what each kind answers
    @abstractmethod
    def __next__(self) -> dict:
        """This rank's next batch; StopIteration at an epoch's end."""

    @abstractmethod
    def __len__(self) -> int:
        """This rank's steps in the current epoch."""

    @abstractmethod
    def batch_at(self, k: int, base: int = 0) -> dict:
        """This rank's k-th batch of the current epoch from global batch ``base``, without moving."""

    @abstractmethod
    def has_batch(self, k: int, base: int | None = None) -> bool:
        """Whether :meth:`batch_at` has a k-th batch."""

    @abstractmethod
    def steps_after(self, base: int) -> int:
        """This rank's batches from global batch ``base`` of the current epoch to its end."""

    @abstractmethod
    def get_state(self) -> dict:
        """The run's state here (``record.envelope``): the same on every rank at the same step."""

    @abstractmethod
    def set_state(self, state: dict, mixture_change: str = "refuse") -> None:
        """Continue after ``state``; ``mixture_change``: what to do with a state of another config
        (:data:`MIXTURE_CHANGES`)."""

    @abstractmethod
    def fingerprint(self) -> str:
        """The data and every setting that shapes the batches."""

    @abstractmethod
    def identity(self) -> dict:
        """What the fingerprint stands for, kept in the state so that a mismatch can say what changed."""

    @abstractmethod
    def position(self) -> tuple[int, int]:
        """``(epoch, consumed)``: where this iterator stands (consumed global batches of the epoch)."""

    @abstractmethod
    def _seek(self, epoch: int, consumed: int, total_steps: int) -> None:
        """Stand at global batch ``consumed`` of ``epoch`` after ``total_steps`` steps, serving nothing."""

    @abstractmethod
    def epoch_batches(self, epoch: int) -> int:
        """Global batches in ``epoch``."""

    @abstractmethod
    def datasets(self) -> list:
        """The indexed datasets this iterator reads (an iterator of the same data built beside it reuses them)."""

    def dictionaries(self) -> list:
        """The dictionaries this iterator loaded (an iterator built beside it reuses them; none: an LM run's)."""
        return []

    def take_row_blocks(self, blocks, of: int) -> None:
        """split="rows": gather row blocks ``blocks`` of the ``of`` equal blocks of every global batch (in
        ascending order, concatenated) instead of block ``rank`` of ``world_size``. The JAX adapter passes the
        blocks that this process's devices hold, which the mesh's device order decides, not the process index.
        The global batches, and so the state, do not change."""
        if self.split != "rows":
            raise UsageError(f"row blocks need split='rows'; this iterator has split={self.split!r}")
        picked = sorted({int(b) for b in blocks})
        if of < 1 or not picked or picked[0] < 0 or picked[-1] >= of:
            raise UsageError(f"row blocks {list(blocks)} are not blocks of {of}: need 0 <= block < {of}, at least one")
        self.row_blocks = (tuple(picked), int(of))

    # ------------------------------------------------------------- remote data, fetched ahead (storage/remote)
    def _fetch_ahead(self):
        """This iterator's :class:`~babelfeed.iterators.fetch_ahead.FetchAhead`, over its ``_fetch_rows`` and
        ``_fetch_shares``."""
        if getattr(self, "_ahead", None) is None:
            self._ahead = FetchAhead(self._fetch_rows, self._fetch_shares)
        return self._ahead

    @property
    def fetch_stride(self) -> int | None:
        """Every how many of this rank's batches this process makes (a DataLoader worker's count), for remote
        data's fetching ahead; None: read from the batches asked for."""
        return self._fetch_ahead().stride

    @fetch_stride.setter
    def fetch_stride(self, n: int | None) -> None:
        self._fetch_ahead().stride = None if n is None else max(int(n), 1)

    def _my_rows(self, n: int) -> np.ndarray:
        """Indices of this rank's rows in a global batch of ``n`` rows (a multiple of the block count)."""
        blocks, of = self.row_blocks
        if n % of:
            raise UsageError(f"a global batch of {n} rows cannot be split into {of} equal row blocks")
        per = n // of
        return (np.asarray(blocks, np.int64)[:, None] * per + np.arange(per)).reshape(-1)

    def __iter__(self):
        return self

    def fingerprints(self) -> tuple:
        """Every fingerprint a state of this data and these settings may carry (older babelfeeds' included)."""
        return (self.fingerprint(),)

    def _state_in(self, state):
        """``state`` itself, or where it is a loader's position or a checkpoint holding a state (another adapter's,
        a StatefulDataLoader's), the iterator state in it (``babelfeed.iterators.state.resolve``)."""
        return upgrade(resolve(state, self) if needs_resolving(state) else state)

    def _check_state(self, state, strict: bool, fields: dict, optional: tuple = ()) -> None:
        """Refuse a state that is not a well-formed state of this iterator (``record.check``) and (``strict``) a
        state saved with other data or settings, naming what changed."""
        self.record.check(state, fields, optional)
        if strict:
            RunRecord.check_fingerprint(state, self.fingerprints(), self.identity())

    def _say_kept_position(self, state: dict) -> None:
        """``mixture_change="keep_position"``: say, once, that a state of another plan resumed at its position."""
        RunRecord.say_kept_position(state, self.fingerprints(), self.identity(), self.position())

    # ------------------------------------------------------------------------------ positions (loaders)
    def state_at(self, epoch: int, consumed: int, total_steps: int) -> dict:
        """The state of this run at global batch ``consumed`` of ``epoch`` after ``total_steps`` steps: what
        ``get_state()`` returns there (the loaders save it at the batch their consumer has reached). Moves the
        iterator there."""
        self._seek(epoch, consumed, total_steps)
        return self.get_state()

    def steps_between(self, start: tuple[int, int], end: tuple[int, int], per: int | None = None) -> int:
        """This rank's steps from position ``start`` = (epoch, consumed) to ``end`` (not before it), counted on
        this iterator's world size (or ``per`` global batches a step): an epoch's last step may take fewer."""
        per = self.batches_per_step if per is None else int(per)
        (e0, c0), (e1, c1) = start, end
        if (e1, c1) < (e0, c0):
            raise UsageError(f"position {end} is before {start}")
        if e0 == e1:
            return -(-(c1 - c0) // per)
        if e1 - e0 > MAX_EPOCHS_AHEAD:
            raise UsageError(f"position (epoch {e1:,}, batch {c1:,}) lies {e1 - e0:,} epochs after (epoch {e0:,}, batch "
                             f"{c0:,}): counting its steps plans every epoch between, and more than "
                             f"{MAX_EPOCHS_AHEAD:,} are refused (a state that says total_steps needs no count)")
        from tqdm.auto import tqdm  # loaded when a bar is drawn (tqdm.auto probes for notebooks)

        steps = -(-max(self.epoch_batches(e0) - c0, 0) // per)
        with tqdm(range(e0 + 1, e1), desc="counting the steps of earlier epochs", unit="epoch",
                  disable=True if e1 - e0 < 50 else None) as epochs:
            for e in epochs:
                steps += -(-self.epoch_batches(e) // per)
        return steps + -(-c1 // per)

    def load_position(self, pos: dict, what: str = "loader") -> tuple[int, int, int]:
        """``(epoch, consumed, total_steps)`` of a loader position (``{"epoch", "consumed", "fingerprint"}``,
        maybe with ``total_steps`` and the state it counts from, ``base``), checked against this iterator's data
        and settings. The iterator is left at ``base`` (or where it stood); steps a position leaves out are
        counted from there on this world size."""
        epoch, consumed = check_position(pos, what)
        base = pos.get("base")
        if base is not None:
            self.set_state(base)
        if pos["fingerprint"] not in self.fingerprints():
            raise StateMismatch(f"this {what} state was saved with different data or settings (fingerprint "
                                f"{pos['fingerprint']}, this config's {self.fingerprint()}; a position saved by an "
                                f"older babelfeed does not say what changed): resume with the config and data it "
                                f"was saved with")
        total = pos.get("total_steps")
        ran_on = pos.get("world_size")  # the world size that took the position's steps, where it says
        if (base is None and isinstance(ran_on, int) and not isinstance(ran_on, bool) and ran_on >= 1
                and ran_on != self.world_size):
            if total is None:
                per = ran_on if self.split == "batches" else 1
                total = self.steps_between((1, 0), (epoch, consumed), per=per)
            self.record.steps.restart(ran_on, self.split)  # so the state says which world size took those steps
        if total is None:
            start = self.position() if base is not None else (1, 0)
            total = (self.total_steps if base is not None else 0) + self.steps_between(start, (epoch, consumed))
        return epoch, consumed, int(total)

    # ------------------------------------------------------------------------------------------ steering
    @property
    def skips(self):
        """The run's skips (``record.skips``: the one engine that says which rows they drop)."""
        return self.record.skips

    @skips.setter
    def skips(self, value) -> None:
        self.record.skips = value

    def skip(self, steps=None, ids=None, where=None, reason: str = "", world_size: int | None = None) -> dict:
        """Leave data out of the rest of the run, from the next step on: ``steps`` (a ``range`` of training steps,
        1-based, not yet taken: every row of their global batches), ``ids`` (samples, by the ``id`` their batches
        carried; an LM run's: the global samples ``trace`` names) or ``where`` (a translation run's
        ``{"stream" | "task" | "corpus": names, "shard": n or [n, ...], "rows": range(lo, hi)}``, an LM run's
        ``{"dataset": names, "documents": range(lo, hi)}``: every sample matching all the terms given). Exactly
        one of them; ``reason`` is kept with it ("loss spike at step 1234").

        Skipped rows leave their batches and nothing else moves: every other sample keeps its step
        (``babelfeed.run.skips`` says what a batch looks like). The skip is recorded in the state's history with
        the step it took effect after, so a run resumed from a later state, on any world size, makes the same
        skip; ``trace``, ``batch_for_step`` and the ledger count with it. After a rollback
        (``set_state(earlier_state)``), a skip of the steps around a spike gives exactly the batches of a run
        that made it at that step from the start. Call it on every rank at the same step. Returns the event
        recorded.

        ``world_size`` (``steps`` only, a translation run with ``split="batches"``): the world size whose steps
        ``steps`` counts, where it is not this iterator's (a run rolled back onto another number of ranks skips
        the steps the run that spiked took)."""
        which_kind(steps, ids, where, reason)
        event = {"event": "skip", "step": int(self.total_steps), **self._skip_position(), "reason": reason}
        if steps is not None:
            event.update(self._skip_steps(steps, world_size))
        elif ids is not None:
            event.update(self._skip_ids(ids))
        else:
            event["where"] = self._skip_where(where)
            self._refuse_skipping_everything(event)
        self.record.skips.add(event)
        self._skips_changed()
        return copy.deepcopy(event)

    @abstractmethod
    def _skip_position(self) -> dict:
        """Where a skip made now takes effect (``epoch`` and ``batch``; an LM run's ``sample``)."""

    @abstractmethod
    def _skip_steps(self, steps, world_size) -> dict:
        """A skip's fields for training steps ``steps`` (a range): the global batches (samples) they hold."""

    @abstractmethod
    def _skip_ids(self, ids) -> dict:
        """A skip's fields for the samples ``ids`` names."""

    @abstractmethod
    def _skip_where(self, where) -> dict:
        """``where``'s terms, checked against this run's corpora."""

    @abstractmethod
    def _refuse_skipping_everything(self, event: dict) -> None:
        """Refuse a ``where`` that, with the earlier skips, leaves nothing to serve."""

    def _skips_changed(self) -> None:
        """Drop what was built on the skips before (fillers, counts)."""

    def set_weights(self, weights: dict):
        """Change the mixture: ``{name: weight}`` for every task (translation: the tasks of the config's tasks
        section, or every direction; the temperature still splits a task's weight among its corpora) or every
        dataset (LM, names as ``dataset_names()``), normalised. Call it on every rank at the same step. The change
        is recorded in the state, so a resumed run mixes exactly as this one, whether it resumes before the
        change (and makes it again) or after it; every stream (dataset) goes on from its position.

        When it takes effect, and what it says: every translation sampler but the stream sampler, the next step,
        as an edit of the config's task weights (:meth:`edit`: its ``EditReport`` is returned and printed once;
        weights already in force are no edit: None); an LM run, the next global batch, as a change of the blend
        (None, nothing printed: the state's history records it); ``mixing.sampler="stream"``, the next planning
        window (the window being served keeps its mix; None). The last two are cheap and quiet enough for a policy
        that calls it every few steps."""
        return self._set_weights(scaled_weights(weights, self.weight_names(), self._weight_noun))

    _weight_noun = "task"

    @abstractmethod
    def weight_names(self) -> list[str]:
        """What :meth:`set_weights` takes a weight of: the tasks, or the datasets of an LM blend."""

    @abstractmethod
    def _set_weights(self, weights: dict):
        """:meth:`set_weights` with the weights checked and scaled."""

    def ledger(self, prefix: str = "ledger", at=None) -> dict:
        """What every rank together has consumed up to this iterator's position, per stream (an LM run: per
        blended dataset), since training began: a flat dict of numbers to log as is (``{prefix}/{stream}/samples``,
        its tokens and ``passes``; ``{prefix}/samples``, ``tokens``, ``step``; what the skips dropped once the run
        skipped anything). The same on every rank at the same step; counted from the plan, so exact after a resume
        on another world size and with workers. ``at``: where to count (what ``ledger_at()`` returned there: the
        adapters' read-ahead threads take one per batch)."""
        return self._ledger(prefix, self.ledger_at() if at is None else at)

    @abstractmethod
    def ledger_at(self):
        """Where :meth:`ledger` counts to, cheap to take after every batch."""

    @abstractmethod
    def _ledger(self, prefix: str, at) -> dict:
        """:meth:`ledger` at ``at``."""

    def trace(self, step: int, state: dict | None = None) -> list:
        """The samples of training step ``step`` (1-based, since training began) on every rank: where each came
        from (``describe_ids``' fields), its rank and whether a skip dropped it. ``state``: the run's latest state
        (default: this iterator's own), whose history answers any step of the run, before and after edits, weight
        changes, skips and resumes on other world sizes. This iterator's position is left as it was."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise UsageError(f"step must be an integer >= 1 (steps count from 1), got {step!r}")
        return self._trace(step, state)

    @abstractmethod
    def _trace(self, step: int, state: dict | None) -> list:
        """:meth:`trace` of a checked step."""

    @abstractmethod
    def describe_ids(self, ids) -> list:
        """Where each sample of a batch came from: per ``id`` (a translation batch's ``id``, an LM run's global
        sample), its stream or dataset and where it lies in the data; ``None`` for -1 (a padding row)."""

    @abstractmethod
    def batch_for_step(self, step: int, state: dict | None = None, rank: int | None = None) -> dict:
        """The batch rank ``rank`` (default: this iterator's) received at training step ``step``, rebuilt exactly
        from the run's latest ``state`` (default: this iterator's own), without serving the steps before it.
        This iterator's position is left as it was."""

    def edit(self, config=None, **changes):
        """Change the run's config from the next step on, in place: ``config`` (a whole config of the same data)
        or ``changes`` to this run's config (``{"mixing.temperature": 2.0}`` as keyword arguments with ``__`` for
        the dots, or a dict as ``config``). Every stream goes on from its position (``babelfeed.run.edits``;
        an LM run: every dataset of the blend). Returns the edit's report (``EditReport``), which is also printed
        once; the state records the edit, so a run resumed later, and ``trace``, follow it. Call it on every rank
        at the same step."""
        return self._edit(config, changes)

    def _edit(self, config, changes: dict, unchanged_ok: bool = False):
        """:meth:`edit`; ``unchanged_ok``: an edited config that plans what the run's does is no edit, and None is
        returned (``set_weights`` with the weights in force, as a policy may call it every few steps)."""
        cfg = edited_config(self, config, changes)
        if unchanged_ok and self.config_snapshot is not None:
            if not [k for k in config_changes(self.config_snapshot, snapshot(cfg)) if k != "data.path"]:
                return None
        if self.kind == "translation" and self.config_snapshot is not None:  # (said before anything is built)
            check_editable(self.config_snapshot, snapshot(cfg), self.planner, self.planner.opts.sampler)
        with reusing(self.datasets(), self.dictionaries()):  # (the data the run has open: not opened and parsed again)
            new = self.build_another(cfg, rank=self.rank, world_size=self.world_size, split=self.split)
        if self.kind == "translation":
            check_sampler(self.planner, new.planner)
        if new.fingerprint() in self.fingerprints():
            if unchanged_ok:
                return None
            what = [k for k in config_changes(self.config_snapshot or {}, snapshot(cfg)) if k != "data.path"]
            if not what:
                raise UsageError("edit: the edited config is this run's config (nothing changed): no edit to make")
            raise UsageError(f"edit: the edited config plans what this run's does ({', '.join(what)} changed, "
                             f"which does not change what the run serves): an iterator of the edited config "
                             f"resumes this run's state as it is (set_state(state)), no edit needed")
        new.take_edit(self)
        self._become(new)
        return self.last_edit

    def take_edit(self, old):
        """:meth:`edit`'s second half: go on with this iterator's config from ``old`` (the run so far)."""
        self.set_state(old.get_state(), mixture_change="allow")
        return self.last_edit

    def _become(self, new) -> None:
        """Take ``new``'s plan and record (an iterator of this run under its edited config), keeping what an
        adapter set on this one (the JAX adapter's row blocks and row multiple)."""
        keep = {k: self.__dict__[k] for k in ("row_blocks", "row_multiple") if k in self.__dict__}
        self.__dict__.clear()
        self.__dict__.update(new.__dict__)
        self.__dict__.update(keep)
        self._ahead = None

