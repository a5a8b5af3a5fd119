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
  ``it.set_state(state, strict=True)`` on a fresh iterator, in any process and on any world size, continues
  with the same global batches. The state names the iterator (``name``) and carries a ``fingerprint`` of the
  data and every setting that shapes the batches: a mismatch raises unless ``strict=False``;
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

import numbers

import numpy as np

from .checks import check_rank

STATE_VERSION = 1


class LoaderIterator:
    """Base of the iterators: rank bookkeeping and the checks every ``set_state`` makes."""

    name: str = "train"
    kind: str = ""

    def __init__(self, rank: int, world_size: int, split: str):
        check_rank(rank, world_size)
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

    def _check_state(self, state, strict: bool, fields: dict, optional: tuple = ()) -> None:
        """Refuse a state that is not a well-formed state of this iterator: not a dict, another version, kind or
        name, a missing or unknown field, an integer field (``fields``: name -> smallest value) that is not an
        integer at least that; and (``strict``) a state saved with other data or settings."""
        if not isinstance(state, dict):
            raise ValueError(f"an iterator state is a dict (from get_state()), got {type(state).__name__}"
                             + (" (a JSON string? json.loads it first)" if isinstance(state, (str, bytes)) else ""))
        if type(state.get("version")) is not int or state["version"] != STATE_VERSION:
            raise ValueError(f"unknown iterator state version {state.get('version')!r} (this babelfeed writes "
                             f"{STATE_VERSION})")
        kind = state.get("kind", "lm" if "consumed_samples" in state else "translation")
        if kind != self.kind:
            raise ValueError(f"this is a state of a {kind} iterator; this iterator is a {self.kind} iterator")
        unknown = sorted(set(state) - {"version", "kind", "name", "fingerprint", *fields, *optional})
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
                             "belongs to this data and these settings. Pass strict=False to resume anyway.")
        if strict and state.get("fingerprint") != fp and state.get("fingerprint") not in self.fingerprints():
            raise ValueError(
                f"iterator state was saved with different data or settings (fingerprint {state.get('fingerprint')} "
                f"!= {fp}): resuming would not continue the same stream. Pass strict=False to resume anyway"
                + (", or, for an edited mixture with mixing.sampler='stream', mixture_change='allow' (every stream "
                   "goes on from its position)." if getattr(self, "config_snapshot", None) is not None else "."))
