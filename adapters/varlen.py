"""Packed batches in the varlen form that FlashAttention's ``flash_attn_varlen_func`` and Megatron's THD layout
take, computed in the loader's workers:

    loader = BatchLoader(config, num_workers=2, transform=Varlen())
    for batch in loader:
        cu, most = batch["cu_seqlens"], batch["max_seqlen"]          # an LM config with mode="pack"
        x = hidden.reshape(-1, d)[batch["indices"]]                    # [tokens, d]: padding left out

For every side that has segment ids (an LM batch's ``segment_ids``; a packed translation batch's
``src_segment_ids`` and ``tgt_segment_ids``, under ``net_input``) it adds, beside them and named after them
(``cu_seqlens`` / ``src_cu_seqlens`` / ``tgt_cu_seqlens``, ...): ``cu_seqlens`` (int32: where each segment starts
among the batch's real tokens, row by row, from 0 to their count; no segment crosses a row), ``max_seqlen``,
``indices`` (the real tokens' places in the flattened ``[rows * width]`` batch) and ``row_cu_seqlens`` (the same
per row, ``[rows, most segments + 1]``). Position ids already restart at 0 in every segment (``positions``,
``src_positions``, ``tgt_positions``). ``babelfeed.plan.packing.varlen`` computes them. numpy only; picklable.

The JAX adapter keeps segment ids and positions: arrays whose length changes from batch to batch would make XLA
compile again.
"""

from __future__ import annotations

from babelfeed.errors import UsageError
from babelfeed.plan.packing import varlen

class Varlen:
    """A batch transform adding the varlen form of every packed side (see the module); ``then``: a transform to
    run after it (``Varlen(then=HFView(pad))``)."""

    def __init__(self, then=None):
        self.then = then

    def check_config(self, config) -> None:
        """Refuse, when the loader is made (not later in a worker), a config whose batches are not packed."""
        section = config.get("train", config) if "data_path" not in config and "train" in config else config
        if "data_path" in section:
            packed = section.get("mode") == "pack"
        else:
            packed = bool(section.get("batching", {}).get("pack"))
        if not packed:
            raise UsageError("Varlen takes packed batches (segment ids): an LM config with mode='pack', or "
                             "batching.pack='SRCxTGT' for translation; this config's batches are padded")
        if self.then is not None and hasattr(self.then, "check_config"):
            self.then.check_config(config)

    def __call__(self, batch: dict) -> dict:
        done = False
        for holder, prefix in ((batch, ""), (batch.get("net_input") or {}, "src_"), (batch.get("net_input") or {},
                                                                                    "tgt_")):
            seg = holder.get(f"{prefix}segment_ids")
            if seg is None:
                continue
            holder.update({f"{prefix}{k}": v for k, v in varlen(seg).items()})
            done = True
        if not done:
            keys = sorted(batch) + sorted(batch.get("net_input") or {})
            raise UsageError(f"Varlen takes packed batches (segment ids: an LM config with mode='pack', or "
                             f"batching.pack for translation); this one has {keys}")
        return self.then(batch) if self.then is not None else batch

