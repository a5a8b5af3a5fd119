"""Layer 4, gather: tokens, read once per batch into padded arrays.

``engine`` (token spaces and the vectorised gather), ``collate`` (the fairseq batch dict and packed rows),
``transforms`` (source noise). Imports plan and below. (What only the adapters use, a batch as one block
between processes and the Hugging Face view, is in ``babelfeed.adapters``.)
"""
