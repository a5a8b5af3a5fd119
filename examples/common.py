"""What the examples share: the config they train from, whatever its layout.

Two layouts are taken:

* the demo's (``configs/demo.py``): the pipeline under ``train``, the model under ``model``, and ``seed``;
* a plain translation pipeline config (``configs/nllb_like.py``, or a user's own): it becomes the ``train``
  section, the model is the demo's small model, and the pipeline keeps its own ``batching.max_tokens``.

A language-model config is refused by name: these examples train translation models.
"""

from __future__ import annotations

import ml_collections

from babelfeed.errors import ConfigError


def demo_model() -> ml_collections.ConfigDict:
    """The demo config's ``model`` section (the small CPU model)."""
    from babelfeed.config.files import config_path, load_config

    return load_config(config_path("configs/demo.py")).model


def example_config(config, where: str = "--config") -> ml_collections.ConfigDict:
    """``config`` in the demo's layout (``seed``, ``train``, ``model``): returned as is when it already is,
    else a translation pipeline config wrapped as its ``train`` section with the demo's model."""
    if "data_path" in config:
        raise ConfigError(f"{where} is a language-model config (data_path, seq_len, ...); this example trains a "
                          f"translation model: give it a translation config such as configs/nllb_like.py")
    if "train" in config and "model" in config:
        return config
    if not {"data", "batching"} <= set(config.keys()):
        have = ", ".join(sorted(config.keys())) or "nothing"
        raise ConfigError(f"{where} is neither a translation pipeline config (data, batching, mixing, ... as in "
                          f"configs/nllb_like.py) nor the demo's layout (train, model); it has {have}")
    out = ml_collections.ConfigDict()
    out.seed = int(config.get("seed", 1))
    out.train = config.copy_and_resolve_references() if hasattr(config, "copy_and_resolve_references") else config
    out.model = demo_model()
    # a pipeline config's own budget and shapes rule, not the demo model's CPU-sized ones
    out.model.max_tokens = int(config.batching.max_tokens)
    if "num_shapes" in config.batching and config.batching.num_shapes:
        out.model.num_shapes = int(config.batching.num_shapes)
    return out


def resolve_config_flag(argv: list) -> list:
    """``argv`` with ``--config=NAME`` (or ``--config NAME``) naming a shipped config (``nllb_like``) replaced by
    its file, as ``babelfeed plan`` takes it; a path that exists is kept."""
    from babelfeed.config.files import config_path

    out, i = list(argv), 1
    while i < len(out):
        arg = out[i]
        if arg.startswith("--config=") and not arg.startswith("--config.="):
            try:
                out[i] = "--config=" + config_path(arg[len("--config="):])
            except FileNotFoundError:
                pass  # absl names the file it could not load
        elif arg == "--config" and i + 1 < len(out):
            try:
                out[i + 1] = config_path(out[i + 1])
            except FileNotFoundError:
                pass
            i += 1
        i += 1
    return out


def quiet_logging() -> None:
    """absl's ``app.run`` sends INFO logs to stderr, and orbax logs ~20 INFO lines a checkpoint (handlers, paths,
    timings), which bury the example's own lines. Warnings and errors still show; ``--verbosity 0`` (absl's flag)
    brings the INFO lines back."""
    from absl import flags, logging

    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
