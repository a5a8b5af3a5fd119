"""Layer 4, gather: tokens, read once per batch into padded arrays.

``engine`` (token spaces and the vectorised gather), ``collate`` (the fairseq batch dict and packed rows),
``transforms`` (source noise), ``transfer`` (a batch as one block between processes), ``hf`` (the Hugging Face
view of a batch). Imports plan and below.
"""
