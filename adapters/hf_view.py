"""The Hugging Face view of a translation batch: what ``transformers`` seq2seq models take as keyword arguments.

    view = HFView(pad=dictionary.pad())
    model(**view(batch))              # input_ids, attention_mask, decoder_input_ids, labels

numpy only (the core imports no framework); ``babelfeed.adapters.hf`` feeds it to a ``Seq2SeqTrainer``.
"""

from __future__ import annotations

import numpy as np

from babelfeed.errors import UsageError

IGNORE = -100  # the label value Hugging Face's loss skips


class HFView:
    """A fairseq-style batch -> ``{"input_ids", "attention_mask", "decoder_input_ids", "labels"}`` (int64):

    * ``input_ids``: the source (language token, tokens, ``</s>``) moved to the left of its row, padding on the
      right as Hugging Face tokenizers pad; ``attention_mask`` 1 on the tokens, 0 on the padding;
    * ``decoder_input_ids``: ``prev_output_tokens`` (``</s>`` then the target shifted right: BART's decoder
      start), right-padded;
    * ``labels``: the target, ``-100`` on padding and on masked rows (``weight`` 0), so they add nothing to the
      loss. A batch whose every row is masked (an epoch-padding batch) keeps its labels, since a loss over no
      token is NaN; with ``loss_scale=True`` the view adds ``loss_scale`` (1.0, or 0.0 for such a batch), which
      ``babelfeed.adapters.hf.Seq2SeqTrainer`` multiplies the loss by and removes before calling the model.

    Picklable: it runs in DataLoader workers (``BatchLoader(config, transform=HFView(pad))``).
    """

    def __init__(self, pad: int, loss_scale: bool = False):
        self.pad, self.loss_scale = int(pad), loss_scale

    def __call__(self, batch: dict) -> dict:
        if not isinstance(batch, dict) or "net_input" not in batch or "target" not in batch:
            keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
            raise UsageError(f"HFView takes a translation batch (net_input, target); this one has {keys}"
                             + (": an LM batch (tokens, labels) is already in the shape causal LMs take"
                                if isinstance(batch, dict) and "tokens" in batch else ""))
        src = np.asarray(batch["net_input"]["src_tokens"], dtype=np.int64)
        tgt = np.asarray(batch["target"], dtype=np.int64)
        prev = np.asarray(batch["net_input"]["prev_output_tokens"], dtype=np.int64)
        weight = np.asarray(batch.get("weight", np.ones(len(src), np.float32)))
        real = src != self.pad
        # each row's tokens first: a stable sort of the columns by "is padding" keeps their order
        order = np.argsort(~real, axis=1, kind="stable")
        input_ids = np.take_along_axis(src, order, axis=1)
        attention_mask = np.take_along_axis(real, order, axis=1).astype(np.int64)
        labels = np.where(tgt == self.pad, IGNORE, tgt)
        any_real = bool((weight > 0).any())
        if any_real:
            labels[weight <= 0] = IGNORE
        view = {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": prev,
                "labels": labels}
        if self.loss_scale:
            view["loss_scale"] = 1.0 if any_real else 0.0
        return view

    def __repr__(self) -> str:
        return f"HFView(pad={self.pad}, loss_scale={self.loss_scale})"
