"""One chunk of binarize's input encoded into work files: the loop both sentences (``binarize.encode``) and
documents (``documents``) run, so that a chunk is read, checked and written one way."""

from __future__ import annotations

from babelfeed.errors import BinarizeError
from babelfeed.preprocess import engines
from babelfeed.preprocess.stats import Stats, _work_prefix
from babelfeed.storage.builder import IndexedDatasetBuilder


def encode_chunk(chunk, work_dir: str, names: list[str], fmt: str, cfg: dict, encode_block, exact: bool = True):
    """Encode ``chunk`` into work files, one dataset per name (a language of a pair, a JSON key), in format
    ``fmt``: the chunk's readers (one per side) are read ``cfg["block_lines"]`` records at a time, and
    ``encode_block(blocks, where, builders, stats)`` writes each block (``where``: each reader's path and first
    line). A reader that ends before the count made earlier is refused (the input changed while binarize ran);
    ``exact``: every take gives all the lines asked for (sentences; a take of documents may give fewer).
    The datasets are finalized together, or aborted together on any error. Returns (shard key, chunk index,
    counts, work prefixes)."""
    prefixes = [_work_prefix(work_dir, chunk, name) for name in names]
    builders = [IndexedDatasetBuilder(p, cfg["dtype"], format=fmt) for p in prefixes]
    readers = [chunk.reader(side) for side in range(len(chunk.sides))]
    stats = Stats()
    try:
        left = chunk.count
        while left:
            want = min(left, cfg["block_lines"])
            where = [(r.path, r.line) for r in readers]
            blocks = [r.take(want) for r in readers]
            counts = [len(b) for b in blocks]
            short = min(range(len(counts)), key=counts.__getitem__)
            if not counts[short] or (exact and counts[short] < want):
                unit = "line" if exact else "record"
                raise BinarizeError(f"{readers[short].path}: ended at line {readers[short].line:,}, before the "
                                    f"{unit} counted earlier (was it changed while binarize ran?)")
            encode_block(blocks, where, builders, stats)
            left -= counts[0]
            engines.fault_point(f"encode:{chunk.name}", cfg.get("fault"))
        for builder in builders:
            builder.finalize()
    except BaseException:
        for builder in builders:
            builder.abort()
        raise
    finally:
        for r in readers:
            r.close()
    return chunk.shard_key, chunk.index, stats, prefixes
