"""Train a small Flax encoder-decoder transformer on babelfeed batches (static shapes, JAX adapter).

    python examples/flax_train.py --config=configs/demo.py [--steps=300] [--config.model.d_model=256]
        [--config.train.mixing.temperature=2]   (the demo config keeps the pipeline under ``train``;
        a plain pipeline config such as configs/nllb_like.py trains the demo's model on its batches)
        [--checkpoint_dir=build/ckpt --save_every=100]   (kill it, run it again: it continues exactly)

Batches come from ``babelfeed.adapters.jax.global_batches``: global jax.Arrays on a mesh of the local devices,
each of one of the config's K static shapes, so the jitted step compiles at most K times (printed at the end).
Runs on the CPU in a couple of minutes with the demo config.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from babelfeed.errors import StateMismatch
from babelfeed.examples.common import example_config, resolve_config_flag

NAME = "flax_train"


def model_pipeline(config):
    """The demo config's pipeline (``config.train``) as this model trains on it: ``model.max_tokens`` per batch
    (small, for the CPU), ``model.num_shapes`` static shapes (one compilation each) and int32 token ids."""
    config = example_config(config, "the config")
    train = config.train
    train.batching.max_tokens = config.model.max_tokens
    train.batching.num_shapes = config.model.num_shapes
    train.collate.dtype = "int32"
    return train


def build_model(vocab: int, d: int, heads: int, layers: int, ff: int, max_len: int, pad: int):
    import flax.linen as nn
    import jax.numpy as jnp

    class Block(nn.Module):
        cross: bool

        @nn.compact
        def __call__(self, x, mask, memory=None, cross_mask=None):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=heads, qkv_features=d)(h, h, mask=mask)
            if self.cross:
                h = nn.LayerNorm()(x)
                x = x + nn.MultiHeadDotProductAttention(num_heads=heads, qkv_features=d)(h, memory, mask=cross_mask)
            h = nn.LayerNorm()(x)
            return x + nn.Dense(d)(nn.gelu(nn.Dense(ff)(h)))

    class Seq2Seq(nn.Module):
        @nn.compact
        def __call__(self, src, prev):
            embed = nn.Embed(vocab, d)
            pos = nn.Embed(max_len, d)
            src_real, prev_real = src != pad, prev != pad
            # positions count real tokens only, so a left-padded source starts at position 0
            src_pos = jnp.clip(jnp.cumsum(src_real, axis=1) - 1, 0, max_len - 1)
            x = embed(src) + pos(src_pos)
            enc_mask = nn.make_attention_mask(src_real, src_real)
            for _ in range(layers):
                x = Block(cross=False)(x, enc_mask)
            x = nn.LayerNorm()(x)
            y = embed(prev) + pos(jnp.arange(prev.shape[1])[None, :])
            dec_mask = nn.combine_masks(nn.make_causal_mask(prev), nn.make_attention_mask(prev_real, prev_real))
            cross_mask = nn.make_attention_mask(prev_real, src_real)
            for _ in range(layers):
                y = Block(cross=True)(y, dec_mask, x, cross_mask)
            return embed.attend(nn.LayerNorm()(y))

    return Seq2Seq()


def train(config, steps: int, log_every: int = 25, log=print, checkpoint_dir: str | None = None,
          save_every: int = 100, stop_after: int | None = None) -> dict:
    """``steps`` optimizer steps on the config's batches. With ``checkpoint_dir``: the train state and the data
    position are saved together with orbax every ``save_every`` steps, and a run finding a checkpoint there
    continues from it, at the batch after the last one trained on. ``stop_after``: end early (as a killed run)."""
    config = example_config(config, "the config")  # the demo's layout, or a plain pipeline config
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import babelfeed
    from babelfeed.adapters import jax as jax_adapter

    train_cfg = model_pipeline(config)
    dictionary = babelfeed.ShardedCorpus(train_cfg.data.path).dictionary()
    pad = dictionary.pad()
    m = config.model
    model = build_model(len(dictionary), m.d_model, m.heads, m.layers, m.ff, m.max_len, pad)
    mesh = Mesh(np.array(jax.local_devices()), ("data",))
    batches = jax_adapter.global_batches(train_cfg, mesh, prefetch=2)
    timed = babelfeed.Timed(batches)  # (iterated: its telemetry() is the loop's wait on data, each stage's time)
    shapes = batches.iterator.planner.opts.shapes
    log(f"model: {m.layers}+{m.layers} layers, d_model {m.d_model}, vocabulary {len(dictionary):,}; "
        f"{len(shapes)} static shapes: {', '.join('x'.join(map(str, s)) for s in shapes)}")

    first = next(iter(batches))
    params = model.init(jax.random.PRNGKey(config.seed), first["net_input"]["src_tokens"][:1],
                        first["net_input"]["prev_output_tokens"][:1])
    schedule = optax.warmup_cosine_decay_schedule(0.0, m.learning_rate, min(100, steps // 5 + 1), steps)
    opt = optax.adamw(schedule, weight_decay=0.01)
    # replicated on the mesh from the start: the step's outputs are, and a different placement would retrace
    replicated = NamedSharding(mesh, PartitionSpec())
    params = jax.device_put(params, replicated)
    opt_state = jax.device_put(opt.init(params), replicated)
    traces = []

    @jax.jit
    def step(params, opt_state, src, prev, target, weight):
        traces.append(src.shape + target.shape)  # runs once per new shape: a compilation

        def loss_fn(p):
            logits = model.apply(p, src, prev)
            mask = (target != pad) * weight[:, None]
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, target)
            return (ce * mask).sum() / jnp.maximum(mask.sum(), 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses, real, padded, tokens, ids = [], 0, 0, 0, []
    t0 = time.perf_counter()
    done = 0
    pending = [first]
    mngr = None
    if checkpoint_dir:  # the train state and the data position, one orbax checkpoint
        import os

        import orbax.checkpoint as ocp

        mngr = ocp.CheckpointManager(os.path.abspath(checkpoint_dir), item_handlers={
            "state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()})
        if mngr.latest_step() is not None:
            done = mngr.latest_step()
            from collections import Counter

            def leaf_shapes(tree):
                return Counter(tuple(getattr(x, "shape", ())) for x in jax.tree_util.tree_leaves(tree))

            saved = mngr.item_metadata(done)["state"]
            saved = leaf_shapes(getattr(saved, "tree", saved))
            if saved != leaf_shapes({"params": params, "opt_state": opt_state}):  # checked before orbax reads a byte
                raise StateMismatch(f"{checkpoint_dir}: its step {done} checkpoint holds another model's arrays (saved "
                                    f"with another config's model or optimizer); use another --checkpoint_dir, or the "
                                    f"config it was saved with")
            try:
                restored = mngr.restore(done, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore({"params": params, "opt_state": opt_state}),
                    data=jax_adapter.orbax_restore()))
            except (ValueError, KeyError, TypeError) as e:
                raise StateMismatch(f"{checkpoint_dir}: its step {done} checkpoint does not fit this config's model "
                                    f"(saved with another model or optimizer: {str(e).splitlines()[0][:200]}); use "
                                    f"another --checkpoint_dir, or the config it was saved with") from None
            params, opt_state = restored.state["params"], restored.state["opt_state"]
            try:
                batches.set_state(restored.data)  # the next batch is the one after the last trained on
            except ValueError as e:
                raise StateMismatch(f"{checkpoint_dir}: its data position does not fit this config: {e}") from None
            pending = []
            if done >= steps:
                log(f"{checkpoint_dir} already holds step {done} of {steps}: nothing to train (raise --steps to "
                    f"go on, or use another --checkpoint_dir)")
            else:
                log(f"resumed from {checkpoint_dir} at step {done}")
    while done < steps and (stop_after is None or done < stop_after):
        for batch in pending or timed:
            src, prev = batch["net_input"]["src_tokens"], batch["net_input"]["prev_output_tokens"]
            params, opt_state, loss = step(params, opt_state, src, prev, batch["target"], batch["weight"])
            losses.append(float(loss))
            ids.append(int(np.asarray(batch["id"]).sum()))
            tokens += batch["ntokens"]
            real += int(batch["net_input"]["src_lengths"].sum()) + batch["ntokens"]
            padded += src.size + batch["target"].size
            done += 1
            if done % log_every == 0 or done == 1:
                window = losses[-log_every:]
                data = babelfeed.reduce_over_ranks(timed.telemetry())  # (every process calls it)
                log(f"step {done:>5}  loss {np.mean(window):.3f}  "
                    f"{tokens / (time.perf_counter() - t0):,.0f} target tokens/s  compilations {len(traces)}  "
                    f"waited on data {data['data/wait_share/max']:.1%}")
            if mngr is not None and (done % save_every == 0 or done == steps):
                mngr.save(done, args=ocp.args.Composite(
                    state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
                    data=jax_adapter.orbax_save(batches)))
            if done >= steps or (stop_after is not None and done >= stop_after):
                break
        pending = []
    elapsed = time.perf_counter() - t0
    batches.close()
    if mngr is not None:
        mngr.wait_until_finished()
        mngr.close()
    if not losses:  # a finished run started again: nothing trained in this process
        return {"losses": [], "compilations": len(traces), "shapes": len(shapes), "first": None, "last": None,
                "batch_ids": [], "steps": done}
    head, tail = np.mean(losses[: max(1, steps // 10)]), np.mean(losses[-max(1, steps // 10):])
    log(f"trained {len(losses)} steps in {elapsed:.0f} s: loss {head:.3f} -> {tail:.3f} (means of the first and "
        f"last tenth); padding efficiency {real / max(padded, 1):.1%}; {len(traces)} compilations for "
        f"{len(shapes)} shapes ({len(set(traces))} used)")
    return {"losses": losses, "compilations": len(traces), "shapes": len(shapes), "first": head, "last": tail,
            "batch_ids": ids, "steps": done}


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
        train(config, flags.FLAGS.steps or config.model.steps, checkpoint_dir=flags.FLAGS.checkpoint_dir,
              save_every=flags.FLAGS.save_every)
    except (ValueError, FileNotFoundError) as e:  # a config, data or checkpoint that does not fit: one line
        print(f"flax_train: error: {e}", file=sys.stderr)
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
    flags.DEFINE_string("checkpoint_dir", None, "save the train state and the data position there with orbax, and "
                        "continue from the latest checkpoint found there")
    flags.DEFINE_integer("save_every", 100, "steps between checkpoints")
    app.run(main, argv=resolve_config_flag(sys.argv))
