"""Layer 5, iterators: the protocol every iterator follows, the translation iterator, its state and history.

``protocol`` (LoaderIterator: positions, checks), ``translation`` (BatchIterator), ``state`` (one state for every
adapter: find it in any checkpoint), ``ledger`` (what a run consumed; trace), ``replay`` (a run's history planned
again: any step), ``edits`` (mixture edits on resume), ``policy`` (weights fed back), ``prefetch`` (read-ahead
threads), ``position`` (loader positions), ``reports``. Imports gather and below.
"""
