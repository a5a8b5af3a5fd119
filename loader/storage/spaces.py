"""Token spaces: where the tokens of a set of ``.bin`` files live, for the gather to read them.

Every ``.bin`` of a run is laid out in a *token space* per stored dtype (``mapping.FlatSpace``: one flat array,
each file at a page boundary, ``MARGIN`` zero tokens before the first file and after the last), or file by file
where flat mapping is unavailable. The layout comes from file sizes alone (nothing is mapped until the first
gather), so planners address tokens as (space, offset) from the start.
"""

from __future__ import annotations

import os

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import DataChangedError
from .mapping import FlatSpace, MappingError, flat_layout, native_available
from .remote import client as remote
from .remote.client import is_shadow


MARGIN = 1 << 20  # tokens of zero padding before and after a flat space: rows up to this wide read no file ends


class TokenSpaces:
    """Where the tokens of a set of datasets live: ``address(ds)`` -> (space id, token offset of the file).

    The layout is computed from file sizes when the set is built (no mapping); the spaces are mapped on first
    use, in the process that gathers (a worker process maps its own). Datasets are grouped by (dtype, value
    shift): fairseq's legacy format stores ids + 1 and is a space of its own.
    """

    def __init__(self, datasets, flat: bool | None = None):
        self.flat = native_available() if flat is None else bool(flat)
        self._datasets: list = []
        self._where: dict[int, tuple[int, int]] = {}
        groups: dict = {}
        for ds in datasets:
            if id(ds) in self._where:
                continue
            self._datasets.append(ds)
            key = (ds.dtype.str, int(ds.token_shift)) if self.flat else len(groups)
            groups.setdefault(key, []).append(ds)
        self._spaces: list[dict] = []
        self._remote: bool | None = None
        self._shadows: dict[int, bool] = {}
        for members in groups.values():
            sid = len(self._spaces)
            dtype = members[0].dtype
            if self.flat:
                base, _, _ = flat_layout([d.bin_size for d in members], dtype, MARGIN)
                margin = MARGIN
            else:
                base, margin = np.zeros(len(members), np.int64), 0
            for d, b in zip(members, base.tolist()):
                self._where[id(d)] = (sid, int(b))
            self._spaces.append({"members": members, "dtype": dtype, "shift": int(members[0].token_shift),
                                 "margin": margin, "tokens": None, "mapping": None})

    def __len__(self) -> int:
        return len(self._spaces)

    @property
    def remote(self) -> bool:
        """Whether some file lies in the shadow of a remote folder (its rows are fetched before they are read)."""
        if self._remote is None:
            self._remote = any(is_shadow(ds.data_file) for ds in self._datasets)
        return self._remote

    def ranges(self, space, start, length, dues=None) -> list:
        """``[[path, byte starts, byte ends, dues, inode], ...]``: the bytes of remote files that tokens ``[start,
        start + length)`` of space ``space`` (one id, or one per row; negative ids are skipped) lie in, each range's
        due (of ``dues``, one per row; None without them), and the file the dataset opened there."""
        start = np.asarray(start, dtype=np.int64)
        length = np.asarray(length, dtype=np.int64)
        if dues is not None:
            dues = np.broadcast_to(np.asarray(dues, np.float64), start.shape)
        out = []
        if np.ndim(space) == 0:
            groups = [(int(space), slice(None))]
        else:  # (rows grouped by space in one sort)
            space = np.asarray(space)
            by = np.argsort(space, kind="stable")
            sv = space[by]
            cuts = np.flatnonzero(np.r_[True, sv[1:] != sv[:-1], True])
            groups = [(int(sv[c0]), by[c0:c1]) for c0, c1 in zip(cuts[:-1].tolist(), cuts[1:].tolist())
                      if sv[c0] >= 0]
        for sid, rows in groups:
            st, ln = start[rows], length[rows]
            keep = ln > 0
            st, ln = st[keep], ln[keep]
            du = None if dues is None else dues[rows][keep]
            if not len(st):
                continue
            members = self._spaces[sid]["members"]
            item = self._spaces[sid]["dtype"].itemsize
            bases = self._bases(sid)
            which = np.searchsorted(bases, st, side="right") - 1
            order = np.argsort(which, kind="stable")  # (rows grouped by file in one sort: a space of a thousand
            # files costs no more than one of a few)
            which, st, ln = which[order], st[order], ln[order]
            du = None if du is None else du[order]
            cuts = np.flatnonzero(np.r_[True, which[1:] != which[:-1], True])
            for c0, c1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
                k = int(which[c0])
                ds = members[k]
                if k >= 0 and self._shadow(ds):
                    a = (st[c0:c1] - bases[k]) * item
                    out.append([ds.data_file, a, a + ln[c0:c1] * item, None if du is None else du[c0:c1],
                                ds.bin_inode])
        return out

    def fetch(self, space, start, length, due: float | None = None) -> None:
        """Make the tokens ``[start, start + length)`` (addresses of space ``space``, one id or one per row) present:
        for rows of remote files, the host's fetcher brings their bytes in, in one request (a no-op for local
        data). ``due``: the clock of the batch reading them (``remote.hint``'s scale: hints due by then are spent)."""
        if self.remote:
            remote.ensure_many(self.ranges(space, start, length), due=due)

    def reading(self, due: float | None = None, prefetched: bool = False) -> "Reading":
        """These spaces as one batch reads them (what a gather is given): its clock ``due``, and ``prefetched``
        when the batch's rows were fetched and pinned already (the iterator's group, ``iterators/fetch_ahead.py``),
        so the gather asks the fetcher for nothing. A row read from a hole would still be caught: remote rows must
        end with </s>, checked as they are gathered."""
        return Reading(self, due, prefetched)


    def _bases(self, sid: int) -> np.ndarray:
        """The token offset of each member file of space ``sid`` (ascending, as laid out), kept."""
        space = self._spaces[sid]
        if "bases" not in space:
            space["bases"] = np.array([self._where[id(d)][1] for d in space["members"]], np.int64)
        return space["bases"]

    def _shadow(self, ds) -> bool:
        known = self._shadows.get(id(ds))
        if known is None:
            known = self._shadows[id(ds)] = is_shadow(ds.data_file)
        return known

    def check_sizes(self) -> None:
        """Refuse to read on when a ``.bin`` of a mapped space was truncated in place since it was opened (a read
        past its new end kills the process with SIGBUS, printing nothing). One ``stat`` per mapped file: the
        iterators call it as each planning window begins."""
        for space in self._spaces:
            if space["tokens"] is None:
                continue
            for ds in space["members"]:
                try:
                    size = os.stat(ds.data_file).st_size
                except OSError:
                    size = -1
                if size < ds.bin_size:
                    raise DataChangedError(ds.data_file, f"truncated while the job reads it ({max(size, 0):,} bytes, "
                                                         f"{ds.bin_size:,} when it was opened): reading on would kill "
                                                         f"the process (SIGBUS). Replace data by writing new files and "
                                                         f"renaming them into place")

    def read_fault(self, sid: int, byte: int) -> Exception:
        """The error for a read of space ``sid`` that faulted at byte ``byte`` of its tokens (the compiled gather
        catches the SIGBUS): a file truncated since it was opened is named as :meth:`check_sizes` names it; else
        the file holding that byte, whose storage failed under the mapping."""
        try:
            self.check_sizes()
        except DataChangedError as e:
            return e
        space = self._spaces[sid]
        item = space["dtype"].itemsize
        token = byte // item
        k = int(np.searchsorted(self._bases(sid), token, side="right")) - 1
        holder = space["members"][k] if k >= 0 and token < self._bases(sid)[k] + space["members"][k].bin_size // item \
            else None
        if holder is None:
            names = ", ".join(d.data_file for d in space["members"][:3])
            return DataChangedError(names, f"a read of the mapped tokens faulted (SIGBUS) at token {token:,} of "
                                           f"their space: a file changed in place or its storage failed")
        offset = byte - self._where[id(holder)][1] * space["dtype"].itemsize
        return DataChangedError(holder.data_file, f"reading byte {offset:,} of it faulted (SIGBUS) while it was "
                                                  f"mapped: it was changed in place or its storage failed (an I/O "
                                                  f"error of a network or failing disk)")

    def address(self, ds) -> tuple[int, int]:
        """(space id, token offset of ``ds``'s first token)."""
        return self._where[id(ds)]

    def margin(self, sid: int) -> int:
        return self._spaces[sid]["margin"]

    def shift(self, sid: int) -> int:
        return self._spaces[sid]["shift"]

    def tokens(self, sid: int) -> np.ndarray:
        space = self._spaces[sid]
        if space["tokens"] is None:
            members = space["members"]
            if self.flat:
                try:
                    space["mapping"] = FlatSpace([d.data_file for d in members], [d.bin_size for d in members],
                                                 space["dtype"], MARGIN, [d.bin_inode for d in members])
                except MappingError as e:
                    raise MappingError(e.errno, f"mapping the {len(members)} .bin files of {space['dtype'].name} "
                                                f"tokens into one space failed: {e.strerror}") from None
                space["tokens"] = space["mapping"].tokens
            else:
                space["tokens"] = members[0].tokens
        return space["tokens"]

    def view(self, sid: int, width: int) -> np.ndarray:
        """A read-only strided view of space ``sid`` whose row k is ``tokens[k : k + width]`` (cached)."""
        views = self._spaces[sid].setdefault("views", {})
        if width not in views:
            tokens = self.tokens(sid)
            views[width] = as_strided(tokens, shape=(len(tokens) - width + 1, width), strides=(tokens.itemsize,) * 2,
                                      writeable=False)
        return views[width]

    def __getstate__(self):
        # mappings are process-local: another process re-derives the same layout and maps on first use
        return {"datasets": self._datasets, "flat": self.flat}

    def __setstate__(self, state):
        self.__init__(state["datasets"], state["flat"])


class Reading:
    """:class:`TokenSpaces` as one batch reads them (:meth:`TokenSpaces.reading`): everything is the spaces',
    but :meth:`fetch` passes the batch's clock, or does nothing for rows fetched ahead."""

    def __init__(self, spaces: TokenSpaces, due: float | None, prefetched: bool):
        self.spaces, self.due, self.prefetched = spaces, due, prefetched

    def __getattr__(self, name):
        return getattr(self.spaces, name)

    def __len__(self) -> int:
        return len(self.spaces)

    def fetch(self, space, start, length) -> None:
        if not self.prefetched:
            self.spaces.fetch(space, start, length, self.due)
