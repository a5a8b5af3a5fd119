"""Train a small torch.nn.Transformer on babelfeed batches (torch adapter).

    python examples/torch_train.py --config=configs/demo.py [--steps=300] [--config.model.d_model=256]
        [--config.train.mixing.temperature=2]   (the demo config keeps the pipeline under ``train``;
        a plain pipeline config such as configs/nllb_like.py trains the demo's model on its batches)
    make demo ARGS="--trainer torch"

Batches come from ``babelfeed.adapters.torch.TorchBatches``: tensors prefetched to the device (pinned memory and
non_blocking copies on a side stream on a GPU; the CPU otherwise).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from babelfeed.examples.common import example_config, resolve_config_flag

NAME = "torch_train"


def model_pipeline(config):
    """The demo config's pipeline (``config.train``) as this model trains on it: ``model.max_tokens`` per batch,
    small for the CPU (torch takes any shape: no static shapes here)."""
    config = example_config(config, "the config")
    train = config.train
    train.batching.max_tokens = config.model.max_tokens
    return train


def build_model(vocab: int, d: int, heads: int, layers: int, ff: int, max_len: int, pad: int):
    import torch
    from torch import nn

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d, padding_idx=pad)
            # the output layer shares this table: N(0, 1/d) entries give logits of unit scale, so an untrained
            # model starts near ln(vocab), not at ~70 (nn.Embedding's default is N(0, 1))
            nn.init.normal_(self.embed.weight, 0.0, d ** -0.5)
            with torch.no_grad():
                self.embed.weight[pad].zero_()
            self.pos = nn.Embedding(max_len, d)
            # the nested-tensor fast path does not apply to pre-LayerNorm layers: build the encoder without it
            layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
            encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d), enable_nested_tensor=False)
            self.core = nn.Transformer(d, heads, num_decoder_layers=layers, dim_feedforward=ff, dropout=0.0,
                                       custom_encoder=encoder, batch_first=True, norm_first=True)
            self.norm = nn.LayerNorm(d)

        def forward(self, src, prev):
            src_pad, prev_pad = src == pad, prev == pad
            src_pos = ((~src_pad).cumsum(dim=1) - 1).clamp(0, max_len - 1)  # left-padded source starts at 0
            x = self.embed(src) * d ** 0.5 + self.pos(src_pos)
            y = self.embed(prev) * d ** 0.5 + self.pos(torch.arange(prev.shape[1], device=prev.device))[None]
            n = prev.shape[1]
            causal = torch.ones(n, n, dtype=torch.bool, device=prev.device).triu(1)  # True: may not attend
            h = self.core(x, y, tgt_mask=causal, src_key_padding_mask=src_pad, tgt_key_padding_mask=prev_pad,
                          memory_key_padding_mask=src_pad, tgt_is_causal=True)
            return self.norm(h) @ self.embed.weight.T

    return Seq2Seq()


def train(config, steps: int, log_every: int = 25, log=print) -> dict:
    config = example_config(config, "the config")  # the demo's layout, or a plain pipeline config
    import torch

    import babelfeed
    from babelfeed.adapters.torch import TorchBatches

    torch.manual_seed(config.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dictionary = babelfeed.ShardedCorpus(config.train.data.path).dictionary()
    pad = dictionary.pad()
    m = config.model
    model = build_model(len(dictionary), m.d_model, m.heads, m.layers, m.ff, m.max_len, pad).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=m.learning_rate, weight_decay=0.01)
    warmup = min(100, steps // 5 + 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    batches = TorchBatches(babelfeed.build_train_iterator(model_pipeline(config)), device=device, prefetch=2)
    timed = babelfeed.Timed(batches)  # (iterated: its telemetry() is the loop's wait on data, each stage's time)
    log(f"model: {m.layers}+{m.layers} layers, d_model {m.d_model}, vocabulary {len(dictionary):,}, on {device}")
    losses, tokens, done = [], 0, 0
    t0 = time.perf_counter()
    while done < steps:
        for batch in timed:
            src, prev = batch["net_input"]["src_tokens"].long(), batch["net_input"]["prev_output_tokens"].long()
            target, weight = batch["target"].long(), batch["weight"]
            logits = model(src, prev)
            ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none")
            mask = (target != pad).float() * weight[:, None]
            loss = (ce.view_as(mask) * mask).sum() / mask.sum().clamp(min=1.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            tokens += batch["ntokens"]
            done += 1
            if done % log_every == 0 or done == 1:
                data = babelfeed.reduce_over_ranks(timed.telemetry())  # (every rank calls it; max: the slowest)
                log(f"step {done:>5}  loss {np.mean(losses[-log_every:]):.3f}  "
                    f"{tokens / (time.perf_counter() - t0):,.0f} target tokens/s  "
                    f"waited on data {data['data/wait_share/max']:.1%}")
            if done >= steps:
                break
    batches.close()
    head, tail = np.mean(losses[: max(1, steps // 10)]), np.mean(losses[-max(1, steps // 10):])
    log(f"trained {done} steps in {time.perf_counter() - t0:.0f} s: loss {head:.3f} -> {tail:.3f}")
    telemetry = babelfeed.reduce_over_ranks(timed.telemetry())
    log(stage_line(telemetry))
    return {"losses": losses, "first": head, "last": tail, "telemetry": telemetry}


def stage_line(t: dict) -> str:
    """One line of a run's data telemetry (``reduce_over_ranks`` of ``Timed.telemetry()``): the wait, and the
    seconds of each stage of making batches (the slowest rank's)."""
    stages = " / ".join(f"{t.get(f'stage/{k}_seconds/max', 0.0):.2f}" for k in ("plan", "fetch", "gather", "collate",
                                                                                "transfer"))
    return (f"data: waited {t['data/wait_seconds/max']:.1f} s ({t['data/wait_share/max']:.1%} of the loop); "
            f"plan / fetch / gather / collate / transfer {stages} s")


def main(argv) -> int:
    from absl import flags

    from babelfeed.examples.common import quiet_logging

    quiet_logging()

    try:
        config = example_config(flags.FLAGS.config)
    except ValueError as e:  # an LM config, or not a config of a translation pipeline: one line
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 2
    if flags.FLAGS.data:
        config.train.data.path = flags.FLAGS.data
    try:
        train(config, flags.FLAGS.steps or config.model.steps)
    except (ValueError, FileNotFoundError) as e:  # a config or data that does not fit: one line
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    # --config=configs/demo.py --config.model.steps=100 --config.train.mixing.temperature=2 (type-checked)
    from babelfeed.config.files import config_path

    # configs/demo.py of the checkout, else the shipped one (python -m babelfeed.examples.NAME, outside it)
    config_flags.DEFINE_config_file("config", config_path("configs/demo.py"), "ml-collections config file",
                                    lock_config=True)
    flags.DEFINE_integer("steps", None, "training steps (default: config.model.steps)")
    flags.DEFINE_string("data", None, "data_bin (default: config.train.data.path)")
    app.run(main, argv=resolve_config_flag(sys.argv))
