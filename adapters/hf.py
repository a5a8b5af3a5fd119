"""Hugging Face: a ``Seq2SeqTrainer`` that trains on babelfeed's batches.

    from babelfeed.adapters.hf import Seq2SeqTrainer
    trainer = Seq2SeqTrainer(model=model, args=Seq2SeqTrainingArguments(...), babelfeed_config=config)
    trainer.train()

Its training DataLoader is :class:`babelfeed.adapters.torch.BatchLoader` with :class:`babelfeed.adapters.hf_view.HFView` applied
in the workers: the model gets ``input_ids``, ``attention_mask``, ``decoder_input_ids`` and ``labels`` (-100 on
padding and masked rows), batches keep babelfeed's mixing, token budgets and static shapes, and a batch with no
real row (an epoch-padding batch) adds nothing to the loss. Set ``per_device_train_batch_size`` aside: the batch
size is the config's token budget. Outside the Trainer, ``HFView(pad)(batch)`` is the view of one numpy batch.

The Trainer's speed metrics count its batch size (``per_device_train_batch_size``, 8 by default) per batch, while
a babelfeed batch holds as many rows as the token budget takes (often ~100): its ``train_samples_per_second`` would
be off by that factor. This Trainer logs what the model really got instead: ``samples_per_second`` and
``tokens_per_second`` (real rows and non-padding target tokens) with each logged loss, and, at the end,
``train_samples_per_second`` and ``train_tokens_per_second`` over the run, summed over every process.

Every checkpoint the Trainer saves holds ``babelfeed_state.json``: the run's data state at that step (the state
every adapter saves, which any of them restores and ``babelfeed trace --state`` reads). ``train(
resume_from_checkpoint=...)`` resumes the data from that state, without replaying the epoch's first batches
(``ignore_data_skip`` is set for the call). Resumed with an edited config (other weights, temperature, corpora
added or removed), give ``mixture_change="allow"``: every stream goes on from its position, the edited mixture from
the next step (``babelfeed.run.edits``; the edit is printed).
"""

from __future__ import annotations

import json
import os
import time

import torch
import transformers

from babelfeed.adapters.hf_view import HFView
from babelfeed.adapters.torch import BatchLoader
from babelfeed.build import is_lm_config
from babelfeed.config.files import translation_section
from babelfeed.errors import ConfigError
from babelfeed.fileio import atomic_write
from babelfeed.run.record import check_mixture_change
from babelfeed.sources.corpus import ShardedCorpus


class _TrainerLoader(BatchLoader):
    """BatchLoader with the Trainer's epochs, which count from 0 (babelfeed's from 1). A checkpoint's data state
    given before the Trainer's first epoch (``resume``) is where that epoch goes on."""

    resume: tuple | None = None  # (state, mixture_change) to load when the Trainer starts its first epoch

    def set_epoch(self, epoch: int) -> None:
        if self.resume is not None:
            state, change = self.resume
            self.resume = None
            self.load_state_dict(state, mixture_change=change)
            return
        super().set_epoch(int(epoch) + 1)


STATE_FILE = "babelfeed_state.json"


class _SaveDataState(transformers.TrainerCallback):
    """Writes the data state into each checkpoint the Trainer saves (on the main process)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        loader = self.trainer._babelfeed_loader
        folder = os.path.join(args.output_dir, f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if loader is None or not state.is_world_process_zero or not os.path.isdir(folder):
            return

        atomic_write(os.path.join(folder, STATE_FILE), json.dumps(loader.state_dict()).encode())


class Seq2SeqTrainer(transformers.Seq2SeqTrainer):
    """``transformers.Seq2SeqTrainer`` whose training batches come from a babelfeed translation config.

    ``babelfeed_config``: the pipeline (``configs/nllb_like.py``-style, or a config's ``train`` section);
    ``num_workers``: DataLoader worker processes. Rank and world size come from torch.distributed, as the
    Trainer launches them. Every other argument is the Trainer's."""

    def __init__(self, *args, babelfeed_config, num_workers: int = 0, mixture_change: str = "refuse", **kwargs):
        if is_lm_config(babelfeed_config):
            raise ConfigError("Seq2SeqTrainer trains on translation batches; this is a language-model config "
                              "(data_path, seq_len): feed LM batches through babelfeed.adapters.torch.BatchLoader")
        babelfeed_config, _ = translation_section(babelfeed_config)  # configs/demo.py: its train section
        super().__init__(*args, **kwargs)
        self.babelfeed_config = babelfeed_config
        self.babelfeed_workers = num_workers

        check_mixture_change(mixture_change)
        self.babelfeed_mixture_change = mixture_change  # a checkpoint of another config: what to do
        self.babelfeed_pad = ShardedCorpus(babelfeed_config.data.path).dictionary().pad()
        self._babelfeed_loader = None
        self._babelfeed_seen = None  # [rows, target tokens] trained on since the last log, on this process
        self._babelfeed_total = [0, 0]  # the same since train() began, every process
        self._babelfeed_since = None
        self.add_callback(_SaveDataState(self))

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """The Trainer's ``train``; resumed from a checkpoint holding babelfeed's data state, the data goes on from
        that state (and with ``mixture_change="allow"`` under an edited config) instead of replaying batches."""
        self._babelfeed_seen, self._babelfeed_total, self._babelfeed_since = None, [0, 0], time.perf_counter()
        folder = resume_from_checkpoint
        if folder is True:
            folder = transformers.trainer_utils.get_last_checkpoint(self.args.output_dir)
        state_file = os.path.join(folder, STATE_FILE) if isinstance(folder, (str, os.PathLike)) else None
        if state_file is None or not os.path.isfile(state_file):
            return super().train(resume_from_checkpoint, *args, **kwargs)
        with open(state_file) as f:
            state = json.load(f)
        loader = self.get_train_dataloader()
        loader.resume = (state, self.babelfeed_mixture_change)
        skip = self.args.ignore_data_skip
        self.args.ignore_data_skip = True  # (the data state is the position: nothing to replay)
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self.args.ignore_data_skip = skip
            loader.resume = None

    def _count(self, inputs, scale) -> None:
        """Add a training batch's real rows and target tokens (an epoch-padding batch, scale 0, adds none)."""
        real = inputs["labels"] != -100
        seen = torch.stack([real.any(dim=-1).sum(), real.sum()])
        if scale is not None:
            seen = seen * (torch.as_tensor(scale).reshape(-1)[0] > 0)
        self._babelfeed_seen = seen if self._babelfeed_seen is None else self._babelfeed_seen + seen

    def log(self, logs: dict, *args, **kwargs) -> None:
        """The Trainer's log, with babelfeed's real samples and tokens per second (every process calls it)."""
        if self._babelfeed_since is not None and ("loss" in logs or "train_runtime" in logs):
            seen = self._babelfeed_seen if self._babelfeed_seen is not None else torch.zeros(2, dtype=torch.long)
            if self.args.world_size > 1:
                seen = self.accelerator.reduce(seen.to(self.args.device), reduction="sum")
            rows, tokens = (int(x) for x in seen.tolist())
            self._babelfeed_seen = None
            now = time.perf_counter()
            elapsed, self._babelfeed_since = max(now - self._babelfeed_since, 1e-9), now
            self._babelfeed_total = [self._babelfeed_total[0] + rows, self._babelfeed_total[1] + tokens]
            if "loss" in logs:
                logs["samples_per_second"] = round(rows / elapsed, 3)
                logs["tokens_per_second"] = round(tokens / elapsed, 3)
            if "train_runtime" in logs:  # the end of train(): the run's real rates replace the batch-size estimate
                runtime = max(float(logs["train_runtime"]), 1e-9)
                logs["train_samples_per_second"] = round(self._babelfeed_total[0] / runtime, 3)
                logs["train_tokens_per_second"] = round(self._babelfeed_total[1] / runtime, 3)
        super().log(logs, *args, **kwargs)

    def get_train_dataloader(self) -> BatchLoader:
        if self._babelfeed_loader is None:
            self._babelfeed_loader = _TrainerLoader(self.babelfeed_config, num_workers=self.babelfeed_workers,
                                                    transform=HFView(self.babelfeed_pad, loss_scale=True))
        return self._babelfeed_loader

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        scale = inputs.pop("loss_scale", None)
        if model.training:
            self._count(inputs, scale)
        # Each batch's loss is the mean over its own labels (masked rows carry -100): babelfeed's batches hold a
        # token budget each, so micro-batches weigh alike, and an epoch-padding batch (every label kept, scale 0)
        # stays finite. The Trainer divides by the gradient accumulation steps only when it believes the model
        # normalised by num_items_in_batch itself (a model taking **kwargs, given the count): it is not given the
        # count here, so the division is done here, or accumulating 4 micro-batches would give 4x the loss.
        out = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=None)
        loss = out[0] if scale is None else out[0] * scale
        told = getattr(self, "loss_is_scaled_for_ga", None)
        trainer_skips_division = told if told is not None else (
            getattr(self, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None)
        if model.training and trainer_skips_division:
            loss = loss / max(int(getattr(self, "current_gradient_accumulation_steps",
                                          self.args.gradient_accumulation_steps)), 1)
        return (loss, out[1]) if return_outputs else loss
