"""Train a small Flax decoder-only language model on babelfeed's LM batches (JAX adapter, every local device).

    python examples/lm_train.py --config=configs/lm_packing.py --config.data_path="0.3 DIR/web 0.7 DIR/books" \
        [--steps=200] [--checkpoint_dir=build/lm_ckpt --save_every=50]   (kill it, run it again: it continues)

``DIR/web`` and ``DIR/books`` are ``babelfeed binarize --documents`` outputs (Megatron .bin/.idx prefixes). Try it
on 8 simulated devices of one CPU with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``: batches arrive as
global ``jax.Array``s sharded over the mesh's data axis. An LM batch is always ``(global_batch, seq_len)``, so the
jitted step compiles once (printed at the end). With ``--checkpoint_dir``, the train state and the data position
are one orbax checkpoint, and a run started again continues at the batch after the last one trained on.
``--reweight_at=N``: from step N, blend the datasets equally (``set_weights``; recorded in the data state).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from babelfeed.errors import ConfigError

NAME = "lm_train"


def build_model(vocab: int, d: int, heads: int, layers: int, ff: int, seq_len: int):
    import flax.linen as nn
    import jax.numpy as jnp

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, mask):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=heads, qkv_features=d)(h, h, mask=mask)
            h = nn.LayerNorm()(x)
            return x + nn.Dense(d)(nn.gelu(nn.Dense(ff)(h)))

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, tokens, positions, segment_ids):
            embed = nn.Embed(vocab, d)
            x = embed(tokens) + nn.Embed(seq_len, d)(positions)
            # causal, and within a document: packed rows hold several (segment ids, 0 = padding)
            same = nn.make_attention_mask(segment_ids, segment_ids, pairwise_fn=jnp.equal)
            mask = nn.combine_masks(nn.make_causal_mask(tokens), same)
            for _ in range(layers):
                x = Block()(x, mask)
            return embed.attend(nn.LayerNorm()(x))

    return Decoder()


def train(config, steps: int, d_model: int = 64, layers: int = 2, learning_rate: float = 3e-3, log=print,
          log_every: int = 10, checkpoint_dir: str | None = None, save_every: int = 50,
          stop_after: int | None = None, reweight_at: int | None = None) -> dict:
    """``steps`` optimizer steps on an LM config's batches (configs/lm_packing.py). See the module's doc."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from babelfeed.adapters import jax as jax_adapter
    from babelfeed.build import is_lm_config

    if not is_lm_config(config):
        raise ConfigError("this example trains a language model: pass an LM config such as configs/lm_packing.py "
                          "(data_path, seq_len, ...); examples/flax_train.py trains on translation configs")
    mesh = Mesh(np.array(jax.devices()), ("data",))
    batches = jax_adapter.global_batches(config, mesh, prefetch=2)
    it = batches.iterator
    vocab = int(config.vocab_size) or 1 + max(_largest_id(s.ds) for s in it.sources)  # (set vocab_size: no scan)
    model = build_model(vocab, d_model, 4, layers, 4 * d_model, int(config.seq_len))
    log(f"model: {layers} layers, d_model {d_model}, vocabulary {vocab:,}; {len(jax.devices())} devices; batches "
        f"{config.global_batch}x{config.seq_len} from {', '.join(it.dataset_names())}")
    shape = (int(config.global_batch), int(config.seq_len))
    dummy = jnp.zeros(shape, jnp.int32)
    params = model.init(jax.random.PRNGKey(config.seed), dummy[:1], dummy[:1], dummy[:1] + 1)
    opt = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, learning_rate, min(20, steps // 5 + 1), steps))
    replicated = NamedSharding(mesh, PartitionSpec())
    params = jax.device_put(params, replicated)
    opt_state = jax.device_put(opt.init(params), replicated)
    traces = []

    @jax.jit
    def step(params, opt_state, tokens, labels, loss_mask, positions, segment_ids):
        traces.append(tokens.shape)  # runs once per new shape: a compilation

        def loss_fn(p):
            logits = model.apply(p, tokens, positions, segment_ids)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
            return (ce * loss_mask).sum() / jnp.maximum(loss_mask.sum(), 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    done, mngr = 0, None
    if checkpoint_dir:
        import orbax.checkpoint as ocp

        mngr = ocp.CheckpointManager(os.path.abspath(checkpoint_dir), item_handlers={
            "state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()})
        if mngr.latest_step() is not None:
            done = mngr.latest_step()
            restored = mngr.restore(done, args=ocp.args.Composite(
                state=ocp.args.StandardRestore({"params": params, "opt_state": opt_state}),
                data=jax_adapter.orbax_restore()))
            params, opt_state = restored.state["params"], restored.state["opt_state"]
            batches.set_state(restored.data)  # the blend's history (set_weights) comes with it
            log(f"resumed from {checkpoint_dir} at step {done}")
    losses, datasets = [], []
    t0 = time.perf_counter()
    while done < steps and (stop_after is None or done < stop_after):
        if reweight_at is not None and done == reweight_at:
            batches.set_weights({name: 1.0 for name in it.dataset_names()})
            log(f"step {done}: datasets blended equally from here")
        batch = next(batches, None)
        if batch is None:
            log(f"the run's {len(it)} global batches (num_samples) are all trained on")
            break
        params, opt_state, loss = step(params, opt_state, batch["tokens"], batch["labels"], batch["loss_mask"],
                                       batch["positions"], batch["segment_ids"])
        losses.append(float(loss))
        datasets.append(np.bincount(np.asarray(batch["dataset"]), minlength=len(it.sources)).tolist())
        done += 1
        if done % log_every == 0 or done == 1:
            log(f"step {done:>5}  loss {np.mean(losses[-log_every:]):.3f}  compilations {len(traces)}")
        if mngr is not None and (done % save_every == 0 or done == steps):
            mngr.save(done, args=ocp.args.Composite(
                state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
                data=jax_adapter.orbax_save(batches)))
    batches.close()
    if mngr is not None:
        mngr.wait_until_finished()
        mngr.close()
    if losses:
        log(f"trained {len(losses)} steps in {time.perf_counter() - t0:.0f} s: loss {losses[0]:.3f} -> "
            f"{np.mean(losses[-max(1, len(losses) // 10):]):.3f}; {len(traces)} compilation(s) for the one shape "
            f"{shape[0]}x{shape[1]}")
    return {"losses": losses, "compilations": len(traces), "datasets": datasets, "steps": done,
            "devices": len(jax.devices())}


def _largest_id(ds) -> int:
    """The largest token id of a dataset (its vocabulary, where the config does not give vocab_size)."""
    data = np.memmap(ds.data_file, dtype=ds.dtype, mode="r")
    return int(data.max()) if len(data) else 0


def main(argv) -> int:
    from absl import flags

    from babelfeed.examples.common import quiet_logging

    quiet_logging()

    f = flags.FLAGS
    try:
        train(f.config, f.steps, checkpoint_dir=f.checkpoint_dir, save_every=f.save_every,
              reweight_at=f.reweight_at)
    except (ValueError, FileNotFoundError) as e:  # a config, data or checkpoint that does not fit: one line
        print(f"{NAME}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    from babelfeed.config.files import config_path

    config_flags.DEFINE_config_file("config", config_path("configs/lm_packing.py"), "an LM config file",
                                    lock_config=True)
    flags.DEFINE_integer("steps", 100, "training steps")
    flags.DEFINE_string("checkpoint_dir", None, "save the train state and the data position there with orbax, and "
                        "continue from the latest checkpoint found there")
    flags.DEFINE_integer("save_every", 50, "steps between checkpoints")
    flags.DEFINE_integer("reweight_at", None, "from this step, blend the datasets equally (set_weights)")
    app.run(main)
