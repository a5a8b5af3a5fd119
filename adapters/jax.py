"""JAX adapter: each host's numpy rows -> global ``jax.Array``s sharded over a Mesh, prefetched to the devices.

    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(-1, 2), ("data", "model"))
    batches = babelfeed.adapters.jax.global_batches(config, mesh, data_axes=("data",), prefetch=2)
    # config: a translation config (configs/tpu_static.py) or a language-model one (configs/lm_packing.py)
    for batch in batches:                      # dict of jax.Array, batch dimension sharded over "data"
        state = train_step(state, batch)
    checkpoint = batches.get_state()           # the position after the last batch handed out

Every host builds the loader with ``split="rows"``: all hosts walk the same global batch each step and each
gathers only the rows its devices hold (the row blocks that the sharding's ``devices_indices_map`` gives them,
which follow the mesh's device order, not ``jax.process_index()``), and
``jax.make_array_from_process_local_data`` assembles them into one global array. The global batch is therefore
the same for any split of hosts x devices and any device order. Translation batches are completed with masked
rows (``weight`` 0) to a multiple of the data-axis devices, so every batch shards. Leaves whose first
dimension is the row count are sharded along ``data_axes`` (replicated over the other mesh axes); anything else
(``ntokens``, per-pair metadata of packed batches) stays a host-local Python/numpy value.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from babelfeed.adapters.prefetch import Prefetcher
from babelfeed.build import build_iterator
from babelfeed.errors import ConfigError, UsageError
from babelfeed.iterators.protocol import LoaderIterator


def data_sharding(mesh: Mesh, data_axes=None) -> NamedSharding:
    """Batch dimension over ``data_axes`` (default: every mesh axis), the rest replicated."""
    if isinstance(data_axes, str):  # one axis by its name ("data"), not its letters
        data_axes = (data_axes,)
    axes = tuple(data_axes) if data_axes is not None else tuple(mesh.axis_names)
    unknown = [a for a in axes if a not in mesh.axis_names]
    if unknown:
        raise UsageError(f"data axes {unknown} are not axes of the mesh {mesh.axis_names}")
    return NamedSharding(mesh, PartitionSpec(axes))


def row_blocks(sharding: NamedSharding) -> tuple[list[int], int]:
    """(the row blocks this process's devices hold, in ascending order; the number of blocks) of a global batch
    sharded by ``sharding``: jax places block b of the batch dimension on the devices whose
    ``devices_indices_map`` slice starts at b, which the order of the mesh's devices decides (a mesh may list
    another process's devices first, or interleave them), not ``jax.process_index()``."""
    spec = sharding.spec[0] if len(sharding.spec) else None
    axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
    shards = int(np.prod([sharding.mesh.shape[a] for a in axes]))
    index = sharding.addressable_devices_indices_map((shards,))
    return sorted({s[0].start or 0 for s in index.values()}), shards


def _rows(batch: dict) -> int:
    net = batch.get("net_input", batch)
    first = net.get("src_tokens", batch.get("tokens"))
    if first is None:
        raise UsageError("cannot tell the batch's row count: no net_input.src_tokens or tokens")
    return int(np.shape(first)[0])


def to_global(batch: dict, sharding: NamedSharding, blocks: tuple | None = None) -> dict:
    """Host-local numpy batch -> the same dict with row-dimensioned arrays as global jax.Arrays.

    ``blocks``: (this process's row blocks, their count), as :func:`row_blocks` gives; the batch holds those
    blocks' rows, concatenated in ascending order (what ``make_array_from_process_local_data`` expects). Default:
    jax infers the global row count (each process feeds an equal share).
    """
    rows = _rows(batch)
    global_rows = None
    if blocks is not None:
        mine, of = blocks
        global_rows = rows * of // len(mine)

    def convert(value):
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == rows:
            shape = None if global_rows is None else (global_rows, *value.shape[1:])
            return jax.make_array_from_process_local_data(sharding, value, shape)
        return value

    return convert(batch)


class DevicePrefetcher(Prefetcher):
    """Converts and transfers up to ``depth`` batches ahead on a background thread.

    ``get_state()`` is the loader state after the last batch handed to the caller (not the read-ahead), so a
    checkpoint resumes exactly; ``set_state`` drops the read-ahead and restarts from there.
    """

    def __init__(self, iterator, sharding: NamedSharding, depth: int = 2, blocks: tuple | None = None):
        self.sharding, self.blocks = sharding, blocks
        super().__init__(iterator, lambda batch: to_global(batch, sharding, blocks), depth, "babelfeed-jax-prefetch")


def global_batches(config, mesh: Mesh, data_axes=None, prefetch: int = 2, epoch: int = 1) -> DevicePrefetcher:
    """The training iterator of ``config`` (translation or LM) for this host, as prefetched global jax.Arrays on
    ``mesh``. ``config`` may also be an iterator already built with ``split="rows"`` for this process.

    The host gathers the rows of the blocks its devices hold (:func:`row_blocks`), so the global arrays are the
    single-process ones whatever the mesh's device order. Translation batches get masked rows (weight 0) up to a
    multiple of the data-axis devices, so every batch shards; an LM ``global_batch`` must be such a multiple.
    """
    if isinstance(config, LoaderIterator):
        iterator = config
        if iterator.split != "rows":
            raise UsageError(f"the iterator has split={iterator.split!r}; JAX global arrays need split='rows' "
                             f"(every host takes its rows of every global batch)")
    else:
        iterator = build_iterator(config, rank=jax.process_index(), world_size=jax.process_count(), epoch=epoch,
                                  split="rows")
    sharding = data_sharding(mesh, data_axes)
    axes = sharding.spec[0]
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    blocks = row_blocks(sharding)
    shards = blocks[1]  # devices the batch axis is split over
    if iterator.kind == "translation":  # masked rows fill every global batch up to a multiple
        iterator.row_multiple = shards
        planner = iterator.planner
        if planner.opts.pack_shape and planner.rows_per_packed_batch() % shards:
            raise ConfigError(f"packed batches of {planner.rows_per_packed_batch()} rows cannot be split over the "
                              f"{shards} devices of the data axes {axes}: choose batching.max_tokens "
                              f"so that max_tokens // max(pack) is a multiple of {shards}")
    elif iterator.global_batch % shards:  # an LM run: a fixed global batch
        raise ConfigError(f"global_batch={iterator.global_batch} cannot be split over the {shards} devices of the "
                          f"data axes {axes}: make it a multiple of {shards}")
    iterator.take_row_blocks(*blocks)
    return DevicePrefetcher(iterator, sharding, prefetch, blocks)


def orbax_save(batches):
    """The data position (``batches.get_state()``: the batch after the last one handed out, not the read-ahead)
    as an orbax checkpoint argument, to save beside the train state in one checkpoint:

        mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=bf_jax.orbax_save(batches)))
        restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(state),
                                                              data=bf_jax.orbax_restore()))
        batches.set_state(restored.data)
    """
    import orbax.checkpoint as ocp  # optional: orbax-checkpoint

    return ocp.args.JsonSave(batches.get_state())


def orbax_restore():
    """The argument that reads back what :func:`orbax_save` wrote (a JSON dict for ``batches.set_state``)."""
    import orbax.checkpoint as ocp  # optional: orbax-checkpoint

    return ocp.args.JsonRestore()
