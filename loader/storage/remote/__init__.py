"""Object stores (``s3://``, ``gs://``, ``az://``), read through one fetcher process per host.

``objects`` (the store's requests, obstore: only the fetcher loads it), ``client`` (what a babelfeed process
calls: a folder's local shadow, ranges ensured and hinted, the fetcher started on demand), ``server`` (the
fetcher process: the cache of shadows, the request scheduler), ``folders`` (the folders it mirrors: stores,
manifests, the per-epoch check of their objects), ``network`` (its connections), ``wire`` (the
messages between them), ``ranges`` (byte-range arithmetic and the requests that cover what is missing),
``pieces`` (one remote file's sparse shadow and what the fetcher holds of it) and ``limits`` (its settings, the
cache's size, where shadows live).
"""
