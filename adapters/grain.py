"""grain adapter: the pipeline as a grain dataset, so grain's worker processes do the gathering.

    ds = loader.adapters.grain.batch_dataset(config, epoch=1, rank=r, world_size=w, num_workers=2)  # MT or LM config
    it = iter(ds)
    for batch in it: ...
    state = it.get_state()          # grain's checkpoint; it.set_state(state) (or orbax's
                                    # grain.checkpoint.CheckpointSave/Restore) resumes at the exact batch

The source is this rank's batches of one epoch, by index: planning is integers, and each worker gathers the
batches grain hands it (contiguous slices, so each worker plans each window once). Three grain 0.2.x traps are
handled here rather than in your script:

* ``mp_prefetch`` reads absl flags and raises ``UnparsedFlagAccessError`` in a plain script: flags are marked
  parsed when nobody parsed them;
* worker processes re-import ``__main__``: the source is picklable and opens nothing until a worker uses it,
  but build the pipeline under ``if __name__ == "__main__":`` in your script;
* grain's default 16 read threads made cheap reads ~12x slower on a 2-core machine: ``num_threads=0`` unless
  asked otherwise;
* grain sends every array through a shared-memory segment of its own (~0.7 ms each here): with workers, a
  batch crosses as one block (``loader.transfer``) and is a plain dict again after ``mp_prefetch``.
"""

from __future__ import annotations

import pickle

import grain

from loader import transfer


class BatchSource:
    """A grain RandomAccessDataSource: record k is this rank's k-th batch of ``epoch`` (a dict of arrays)."""

    def __init__(self, config, epoch: int = 1, rank: int = 0, world_size: int = 1, split: str | None = None,
                 packed: bool = False):
        self.config, self.epoch, self.rank, self.world_size, self.split = config, epoch, rank, world_size, split
        self.packed = packed  # one block per batch (loader.transfer), for the trip out of a worker process
        self._iterator = None
        self._len = None

    def _it(self):
        if self._iterator is None:  # opened lazily, in the process that reads
            from loader.build import build_iterator

            self._iterator = build_iterator(self.config, rank=self.rank, world_size=self.world_size,
                                            epoch=self.epoch, split=self.split)
        return self._iterator

    def __len__(self) -> int:
        if self._len is None:
            self._len = len(self._it())
        return self._len

    def __getitem__(self, k: int) -> dict:
        batch = self._it().batch_at(int(k))
        if not self.packed:
            return batch
        block, plan, scalars = transfer.pack(batch)
        return {"block": block, "layout": pickle.dumps((plan, scalars))}

    def __getstate__(self):
        return {"config": self.config, "epoch": self.epoch, "rank": self.rank, "world_size": self.world_size,
                "split": self.split, "len": self._len, "packed": self.packed}

    def __setstate__(self, state):
        self.__init__(state["config"], state["epoch"], state["rank"], state["world_size"], state["split"],
                      state["packed"])
        self._len = state["len"]

    def __repr__(self) -> str:  # grain writes it into its checkpoints
        return f"BatchSource(epoch={self.epoch}, rank={self.rank}, world_size={self.world_size}, split={self.split})"


def _flags_parsed() -> None:
    try:
        from absl import flags
    except ImportError:
        return
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def batch_dataset(config, epoch: int = 1, rank: int = 0, world_size: int = 1, num_workers: int = 0,
                  per_worker_buffer_size: int = 2, read_threads: int = 0, split: str | None = None):
    """This rank's batches of one epoch as a grain IterDataset (``num_workers`` > 0: gathered in worker
    processes via ``mp_prefetch``). ``config``: a translation or a language-model config (``split=None``: the
    iterator's own default, whole batches per rank for translation, rows of every global batch for LM)."""
    source = BatchSource(config, epoch, rank, world_size, split, packed=num_workers > 0)
    len(source)  # plan once here, so workers inherit the length instead of each planning the epoch
    ds = grain.MapDataset.source(source).to_iter_dataset(
        grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(1, per_worker_buffer_size)))
    if num_workers > 0:
        _flags_parsed()
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers,
                                                        per_worker_buffer_size=per_worker_buffer_size))
        ds = ds.map(_unpack)  # each batch crossed as one shared-memory block; a plain dict again
    return ds


def _unpack(element: dict) -> dict:
    plan, scalars = pickle.loads(element["layout"])
    return transfer.unpack(element["block"], plan, scalars)
