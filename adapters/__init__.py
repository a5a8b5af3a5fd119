"""Framework glue (torch, jax, grain), installed as ``babelfeed.adapters``.

Each adapter module imports its framework itself; importing this package imports none of them.
"""
