"""Static shapes for XLA (TPU/GPU with jax.jit): every batch takes one of 8 shapes, split by rows over hosts.

    batches = babelfeed.adapters.jax.global_batches(babelfeed.load_config("configs/tpu_static.py"), mesh)
"""

import importlib.util
import os


def get_config():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nllb_like.py")
    spec = importlib.util.spec_from_file_location("babelfeed_nllb_like", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.batching.num_shapes = 8  # one jit compilation per shape, at most 8
    c.batching.max_tokens = 16384
    c.filter.max_source_positions = 256
    c.filter.max_target_positions = 256
    c.collate.dtype = "int32"  # JAX's default integer width
    return c
