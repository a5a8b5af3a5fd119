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

Global batches never depend on the world size, so a job resumes elastically on another number of ranks.
An iterator plans its windows lazily and is not thread-safe: call it from one thread at a time (the grain
adapter's source serialises grain's read threads).
:class:`~babelfeed.batches.BatchIterator` (translation, ``build_train_iterator``) and
:class:`~babelfeed.lm.LMIterator` (language modelling) implement it; ``babelfeed.build_iterator(config, ...)`` builds
either from its config, and the JAX, torch and grain adapters take any of them.
"""

from __future__ import annotations

import json
import numbers

import numpy as np

from babelfeed.checks import check_rank
from babelfeed.errors import BabelfeedError
from babelfeed.iterators.history import VERSION as STATE_VERSION

# Counting steps over epochs plans every epoch between (integers only; ~1,000 small epochs a second, a large
# corpus's epoch in seconds): a position or step further ahead than this is refused rather than planned for hours
MAX_EPOCHS_AHEAD = 10_000

# How an iterator builds another from a config (an edited resume rebuilds the saved run's, trace and the loaders
# build the run's): the builders are registered by babelfeed.build, a layer above, which every import of
# babelfeed loads first. "translation": build_train_iterator; "any": build_iterator.
_BUILDERS: dict = {}


def register_builder(kind: str, build) -> None:
    _BUILDERS[kind] = build


def builder(kind: str):
    """The registered builder of ``kind`` (see ``_BUILDERS``)."""
    if kind not in _BUILDERS:
        raise RuntimeError(f"no {kind!r} iterator builder registered: import babelfeed (babelfeed.build registers them)")
    return _BUILDERS[kind]


class StateMismatch(BabelfeedError, ValueError):
    """A state saved with other data or settings than this iterator's."""


# What ``set_state(state, mixture_change=...)`` does with a state of another config:
MIXTURE_CHANGES = {
    "refuse": "refused, naming what differs (the default)",
    "allow": "an edit: every stream goes on from its position under this config, from the next step; the planning "
             "window in progress gives its rows not yet served back to their streams, so nothing is repeated or "
             "skipped (the data of a kept stream and the seed must be the same)",
    "keep_position": "this config's plan from the state's epoch and global batch: the saved plan's samples not yet "
                     "served there may be skipped and its served ones come again (which ones is not known); the "
                     "only choice for a state with no fingerprint or config (an older babelfeed's) or of changed "
                     "data",
}
# what a state mismatch says about the choices (the command line, which takes no such choice, leaves it out)
EDIT_HINT = (" (set_state(state, mixture_change='allow') continues an edited mixture from its next step, every "
             "stream from its position; mixture_change='keep_position' resumes at the same global batch of this "
             "config's plan, repeating or skipping samples)")


def check_mixture_change(value) -> None:
    if value not in MIXTURE_CHANGES:
        raise ValueError(f"mixture_change must be one of {list(MIXTURE_CHANGES)}, got {value!r}: "
                         + "; ".join(f"{k!r}: {v}" for k, v in MIXTURE_CHANGES.items()))


def say_kept_position(it, state: dict) -> None:
    """Say, once, that a state of another plan resumed at its position of this one (``keep_position``)."""
    import warnings

    from babelfeed.errors import Notice, user_frame

    if state.get("fingerprint") in it.fingerprints():
        return
    what = "; ".join(identity_changes(state.get("identity"), it.identity())) or "a state with no fingerprint"
    epoch, consumed = it.position()
    warnings.warn(f"resumed at epoch {epoch}, global batch {consumed} of this config's plan, which is not the plan "
                  f"the state was saved with ({what}): from here the batches are this plan's, so samples the saved "
                  f"run had planned and not served may be skipped and samples it served may come again (which ones "
                  f"is not known; mixture_change='allow' continues every stream where it stood instead)", Notice,
                  stacklevel=user_frame())


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def identity_changes(saved, now) -> list[str]:
    """What differs between two identities (``identity()``: plan options, split, shards, per-stream data), in the
    config's words: ``batching.max_tokens 2048 -> 4096``, ``the data of stream x changed``, ``stream y added``."""
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return []
    from babelfeed.plan.options import OPTION_KEYS

    out = []
    a, b = saved.get("opts") or {}, now.get("opts") or {}
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            out.append(f"{OPTION_KEYS.get(k, k)} {_short(a.get(k))} -> {_short(b.get(k))}")
    for k in ("split", "shards"):
        if saved.get(k) != now.get(k):
            out.append(f"data.{'train_split' if k == 'split' else 'shards'} {_short(saved.get(k))} -> {_short(now.get(k))}")
    sa, sb = saved.get("streams") or {}, now.get("streams") or {}
    gone, new = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
    moved = sorted(k for k in set(sa) & set(sb) if sa[k] != sb[k])
    if moved:
        out.append(f"the data of stream(s) {moved[:5]}{' ...' if len(moved) > 5 else ''} changed (other files, "
                   f"tokenizer or prefix tokens)")
    if gone:
        out.append(f"stream(s) {gone[:5]}{' ...' if len(gone) > 5 else ''} removed")
    if new:
        out.append(f"stream(s) {new[:5]}{' ...' if len(new) > 5 else ''} added")
    for k in sorted(set(saved) - {"opts", "split", "shards", "streams"}):
        if saved.get(k) != now.get(k):
            out.append(f"{k} {_short(saved.get(k))} -> {_short(now.get(k))}")
    return out


class LoaderIterator:
    """Base of the iterators: rank bookkeeping and the checks every ``set_state`` makes."""

    name: str = "train"
    kind: str = ""

    def __init__(self, rank: int, world_size: int, split: str):
        check_rank(rank, world_size)
        self.last_edit = None  # the report of the last mixture edit this iterator made (iterators.edits)
        self.config_snapshot: dict | None = None  # the config as JSON (set where it was built from one)
        self.source_config = None  # the config it was built from
        if split not in ("batches", "rows"):
            raise ValueError(f"split must be 'batches' or 'rows', got {split!r}")
        self.rank, self.world_size, self.split = rank, world_size, split
        # split="rows": which of how many equal row blocks of every global batch this rank gathers
        self.row_blocks: tuple = ((rank,), world_size)

    def take_row_blocks(self, blocks, of: int) -> None:
        """split="rows": gather row blocks ``blocks`` of the ``of`` equal blocks of every global batch (in
        ascending order, concatenated) instead of block ``rank`` of ``world_size``. The JAX adapter passes the
        blocks that this process's devices hold, which the mesh's device order decides, not the process index.
        The global batches, and so the state, do not change."""
        if self.split != "rows":
            raise ValueError(f"row blocks need split='rows'; this iterator has split={self.split!r}")
        picked = sorted({int(b) for b in blocks})
        if of < 1 or not picked or picked[0] < 0 or picked[-1] >= of:
            raise ValueError(f"row blocks {list(blocks)} are not blocks of {of}: need 0 <= block < {of}, at least one")
        self.row_blocks = (tuple(picked), int(of))

    # ------------------------------------------------------------- remote data, fetched ahead (storage/fetcher)
    def _fetch_ahead(self):
        """This iterator's :class:`~babelfeed.iterators.fetch_ahead.FetchAhead`, over its ``_fetch_rows`` and
        ``_fetch_shares``."""
        if getattr(self, "_ahead", None) is None:
            from .fetch_ahead import FetchAhead

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
            raise ValueError(f"a global batch of {n} rows cannot be split into {of} equal row blocks")
        per = n // of
        return (np.asarray(blocks, np.int64)[:, None] * per + np.arange(per)).reshape(-1)

    def __iter__(self):
        return self

    def fingerprint(self) -> str:
        raise NotImplementedError

    def fingerprints(self) -> tuple:
        """Every fingerprint a state of this data and these settings may carry (older babelfeeds' included)."""
        return (self.fingerprint(),)

    def _state_in(self, state):
        """``state`` itself, or where it is a loader's position or a checkpoint holding a state (another adapter's,
        a StatefulDataLoader's), the iterator state in it (``babelfeed.iterators.state.resolve``)."""
        from babelfeed.iterators.history import upgrade
        from babelfeed.iterators.state import needs_resolving, resolve

        return upgrade(resolve(state, self) if needs_resolving(state) else state)

    def _check_state(self, state, strict: bool, fields: dict, optional: tuple = ()) -> None:
        """Refuse a state that is not a well-formed state of this iterator: not a dict, another version, kind or
        name, a missing or unknown field, an integer field (``fields``: name -> smallest value) that is not an
        integer at least that; and (``strict``) a state saved with other data or settings."""
        if not isinstance(state, dict):
            raise ValueError(f"an iterator state is a dict (from get_state()), got {type(state).__name__}"
                             + (" (a JSON string? json.loads it first)" if isinstance(state, (str, bytes)) else ""))
        if type(state.get("version")) is not int or state["version"] != STATE_VERSION:
            raise ValueError(f"unknown iterator state version {state.get('version')!r} (this babelfeed writes "
                             f"{STATE_VERSION} and reads 1 to {STATE_VERSION})")
        kind = state.get("kind", "lm" if "consumed_samples" in state else "translation")
        if kind != self.kind:
            raise ValueError(f"this is a state of a {kind} iterator; this iterator is a {self.kind} iterator")
        unknown = sorted(set(state) - {"version", "kind", "name", "fingerprint", "identity", *fields, *optional})
        if unknown:
            raise ValueError(f"iterator state has unknown fields {unknown} (edited, or from another program)")
        missing = [k for k in ("name", *fields) if k not in state]
        if missing:
            raise ValueError(f"iterator state lacks {missing}")
        for key, smallest in fields.items():
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < smallest:
                raise ValueError(f"iterator state field {key!r} must be an integer >= {smallest}, got {value!r}")
        if state["name"] != self.name:
            raise ValueError(f"iterator state is for the {state['name']!r} iterator, this one is {self.name!r}")
        if "fingerprint" in state and not isinstance(state["fingerprint"], str):
            raise ValueError(f"iterator state fingerprint must be a string, got {state['fingerprint']!r}")
        fp = self.fingerprint()
        if strict and "fingerprint" not in state:
            raise ValueError("iterator state has no fingerprint (saved by an older babelfeed): nothing proves it "
                             "belongs to this data and these settings. set_state(state, "
                             "mixture_change='keep_position') resumes at its position anyway.")
        if strict and state.get("fingerprint") != fp and state.get("fingerprint") not in self.fingerprints():
            changed = identity_changes(state.get("identity"), self.identity())
            what = "; ".join(changed) if changed else f"fingerprint {state.get('fingerprint')} != {fp}"
            raise StateMismatch(
                f"iterator state was saved with different data or settings ({what}): resuming would not continue "
                f"the same stream. Resume with the config and data it was saved with{EDIT_HINT}")

    def identity(self) -> dict | None:
        """What the fingerprint stands for, kept in the state so that a mismatch can say what changed."""
        return None

    # ------------------------------------------------------------------------------ positions (loaders)
    def _seek(self, epoch: int, consumed: int, total_steps: int) -> None:
        """Stand at global batch ``consumed`` of ``epoch`` after ``total_steps`` steps, serving nothing."""
        raise NotImplementedError

    def state_at(self, epoch: int, consumed: int, total_steps: int) -> dict:
        """The state of this run at global batch ``consumed`` of ``epoch`` after ``total_steps`` steps: what
        ``get_state()`` returns there (the loaders save it at the batch their consumer has reached). Moves the
        iterator there."""
        self._seek(epoch, consumed, total_steps)
        return self.get_state()

    def epoch_batches(self, epoch: int) -> int:
        """Global batches in ``epoch``."""
        raise NotImplementedError

    def steps_between(self, start: tuple[int, int], end: tuple[int, int], per: int | None = None) -> int:
        """This rank's steps from position ``start`` = (epoch, consumed) to ``end`` (not before it), counted on
        this iterator's world size (or ``per`` global batches a step): an epoch's last step may take fewer."""
        per = self.batches_per_step if per is None else int(per)
        (e0, c0), (e1, c1) = start, end
        if (e1, c1) < (e0, c0):
            raise ValueError(f"position {end} is before {start}")
        if e0 == e1:
            return -(-(c1 - c0) // per)
        if e1 - e0 > MAX_EPOCHS_AHEAD:
            raise ValueError(f"position (epoch {e1:,}, batch {c1:,}) lies {e1 - e0:,} epochs after (epoch {e0:,}, batch "
                             f"{c0:,}): counting its steps plans every epoch between, and more than "
                             f"{MAX_EPOCHS_AHEAD:,} are refused (a state that says total_steps needs no count)")
        from tqdm.auto import tqdm

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
        from babelfeed.iterators.state import check_position

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
                and ran_on != self.world_size and hasattr(self, "step_log")):
            if total is None:
                per = ran_on if self.split == "batches" else 1
                total = self.steps_between((1, 0), (epoch, consumed), per=per)
            self.step_log = [[0, 1, 0, ran_on, self.split]]  # so the state says which world size took those steps
        if total is None:
            start = self.position() if base is not None else (1, 0)
            total = (self.total_steps if base is not None else 0) + self.steps_between(start, (epoch, consumed))
        return epoch, consumed, int(total)

    def position(self) -> tuple[int, int]:
        """``(epoch, consumed)``: where this iterator stands."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ steering
    def edit(self, config=None, **changes):
        """Change the run's config from the next step on, in place: ``config`` (a whole config of the same data)
        or ``changes`` to this run's config (``{"mixing.temperature": 2.0}`` as keyword arguments with ``__`` for
        the dots, or a dict as ``config``). Every stream goes on from its position (``babelfeed.iterators.edits``;
        an LM run: every dataset of the blend). Returns the edit's report (``EditReport``), which is also printed
        once; the state records the edit, so a run resumed later, and ``trace``, follow it. Call it on every rank
        at the same step."""
        from babelfeed.iterators.edits import edited_config

        new = builder("any")(edited_config(self, config, changes), rank=self.rank, world_size=self.world_size,
                             split=self.split)
        if new.fingerprint() in self.fingerprints():
            raise ValueError("edit: the edited config plans what this run's does (nothing that shapes the batches "
                             "changed)")
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

