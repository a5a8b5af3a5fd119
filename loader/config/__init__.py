"""Layer 8, config: config files read and checked (``files``: load_config, overrides, the translation section).
"""

from babelfeed._compat import former_module

# babelfeed.config was one module, now babelfeed.config.files: its names are still found here
__getattr__ = former_module(__name__, "files")
