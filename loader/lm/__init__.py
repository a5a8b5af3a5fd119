"""Layer 6, lm: the language-model planner and iterator (Megatron's blend, GPT sample index, packing).

``iterator`` (LMIterator), ``plan`` (its sample index), ``blending`` (Megatron's blending and splits).
Imports iterators and below.
"""

from babelfeed._compat import former_module

# babelfeed.lm was one module, now babelfeed.lm.iterator: its names are still found here
__getattr__ = former_module(__name__, "iterator")
