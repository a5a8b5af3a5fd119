"""Layer 6, iterators: the protocol every iterator follows, and the translation iterator.

``protocol`` (LoaderIterator, an abstract class: positions, checks, and the steering, declared once),
``translation`` (BatchIterator: serving), ``translation_ledger``, ``translation_skips`` and ``translation_state``
(its ledger, skips and state), ``state`` (one state for every adapter: find it in any checkpoint), ``ledger``
(trace), ``replay`` (a run's history planned again: any step), ``policy`` (weights fed back), ``reports``. The run
record they hold is ``babelfeed.run``; the loaders' positions and read-ahead threads are ``babelfeed.adapters``'.
Imports run and below.
"""
