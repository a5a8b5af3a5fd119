"""Layer 2, sources: the corpora a run reads, as lengths and rows (no token is read here).

``corpus`` (a data_bin's (direction, shard) files), ``dictionary`` (fairseq's dict.txt), ``rows`` (row tables and
length caches), ``sources`` (the components of a split, their streams and tasks), ``subword`` (raw text segmented
anew each epoch). Imports storage and the base modules only.
"""
