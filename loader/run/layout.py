"""What a run's sample ids and stream numbers mean, the same for the whole run: a component of the run record.

A batch's ``id`` names a sample (a stream's shard and its row there) and its ``direction`` a stream. Without an
edit they are the plain numbering of the config's streams and their shards (ids one shard after another, streams
in the config's order). A mixture edit that adds or removes streams must not renumber them: an id traced before
the edit, a skip by id after it, or a model that takes ``direction`` as a language label would otherwise mean
another sample or stream. So from the first such edit on the run keeps its layout: every stream it ever had, in
the order it first came (new ones after), and every shard's first id (a new shard after the last id used; a
removed one keeps its ids, which still name it). It is written into the state only where it differs from the
plain numbering.
"""

from __future__ import annotations

import numpy as np

from babelfeed.errors import StateError


def _key(stream: str, shard: int) -> str:
    return f"{stream}\t{int(shard)}"


class Layout:
    """The run's streams (``streams``: every one it had, in the order it first came) and each shard's ids
    (``shards``: ``"stream\\tshard"`` -> ``[first id, rows]``), ``next``: the first id not used."""

    def __init__(self, streams=(), shards=None, next_id: int = 0):
        self.streams: list = list(streams)
        self.shards: dict = dict(shards or {})
        self.next = int(next_id)

    @classmethod
    def plain(cls, planner) -> "Layout":
        """The plain numbering of ``planner``'s streams and shards (what a run never edited has)."""
        shards, at = {}, 0
        for c in planner.sources.components:
            shards[_key(c.key, c.shard)] = [at, len(c)]
            at += len(c)
        return cls(planner.keys, shards, at)

    def extended(self, planner) -> "Layout":
        """This layout with ``planner``'s streams and shards it lacks added after its own."""
        out = Layout(self.streams, {k: list(v) for k, v in self.shards.items()}, self.next)
        for k in planner.keys:
            if k not in out.streams:
                out.streams.append(k)
        for c in planner.sources.components:
            key = _key(c.key, c.shard)
            if key not in out.shards:
                out.shards[key] = [out.next, len(c)]
                out.next += len(c)
        return out

    # ------------------------------------------------------------------------------------ component
    def get_state(self) -> dict:
        return {"streams": list(self.streams), "shards": {k: list(v) for k, v in self.shards.items()},
                "next": int(self.next)}

    @classmethod
    def from_state(cls, d, planner) -> "Layout":
        cls.check(d, planner)
        return cls(d["streams"], d["shards"], d["next"])

    @staticmethod
    def check(d, planner) -> None:
        """Refuse a layout that is malformed or does not hold every stream and shard of ``planner`` (with their
        rows)."""
        ok = (isinstance(d, dict) and set(d) == {"streams", "shards", "next"} and isinstance(d["streams"], list)
              and all(isinstance(s, str) for s in d["streams"]) and len(set(d["streams"])) == len(d["streams"])
              and isinstance(d["shards"], dict) and type(d["next"]) is int and d["next"] >= 0
              and all(isinstance(k, str) and isinstance(v, list) and len(v) == 2 and all(type(x) is int and x >= 0
                                                                                        for x in v)
                      for k, v in d["shards"].items()))
        if not ok:
            raise StateError(f"iterator state field 'layout' (the run's stream and id numbering) is not well formed: "
                             f"{str(d)[:200]}")
        spans = sorted((a, a + n) for a, n in d["shards"].values())
        if any(b > c for (_, b), (c, _) in zip(spans, spans[1:])) or (spans and spans[-1][1] > d["next"]):
            raise StateError("iterator state field 'layout': two shards' ids overlap (edited or damaged)")
        missing = [k for k in planner.keys if k not in d["streams"]]
        wrong = [key for c in planner.sources.components
                 if d["shards"].get(key := _key(c.key, c.shard), [0, len(c)])[1] != len(c)
                 or key not in d["shards"]]
        if missing or wrong:
            what = f"streams {missing[:5]}" if missing else f"shards {[w.replace(chr(9), '/') for w in wrong[:5]]}"
            raise StateError(f"iterator state field 'layout' lacks or miscounts this config's {what}: a state of "
                             f"another run, or edited")

    def is_plain(self, planner) -> bool:
        p = Layout.plain(planner)
        return self.streams == p.streams and self.shards == p.shards and self.next == p.next

    # ------------------------------------------------------------------------------------ use
    def apply(self, collater, planner) -> None:
        """Give ``collater`` this layout: its ids per shard and its stream numbers."""
        bases = [self.shards[_key(c.key, c.shard)][0] for c in planner.sources.components]
        collater.id_base = np.array(bases + [self.next], np.int64)
        collater.stream_index = np.array([self.streams.index(k) for k in planner.keys], np.int32)

    def removed(self, planner) -> list[tuple[int, int, str, int]]:
        """``(first id, rows, stream, shard)`` of the shards this layout holds that ``planner`` does not read."""
        have = {_key(c.key, c.shard) for c in planner.sources.components}
        out = []
        for k, (a, n) in self.shards.items():
            if k not in have:
                stream, shard = k.rsplit("\t", 1)
                out.append((a, n, stream, int(shard)))
        return out
