"""Layer 7, lm: the language-model planner and iterator (Megatron's blend, GPT sample index, packing).

``iterator`` (LMIterator: serving), ``run`` (its state, blend, skips, trace and ledger), ``plan`` (its sample
index), ``blending`` (Megatron's blending and splits), ``mixture`` (the blend over time).
Imports iterators and below.
"""
