"""Layer 5, run: the run record, what happened to a run besides its position, one component per kind of fact.

A run's batches are a pure function of its config, its data and what happened to it. Each kind of fact is a
component that owns its data, with ``get_state()``, ``set_state()`` and ``check()``: ``steps`` (the world sizes
that took its steps), ``weights`` (weights fed back, how schedule updates were counted, an LM run's blend),
``edits`` (mixture edits: what changed and where), ``skips`` (data left out after a loss spike) and ``ledger``
(what the run consumed, where it cannot be counted from the plan). ``record`` composes them into the saved state
(version, kind, name, position, fingerprint, identity, history); ``history`` is the one list of events they write
into and the one place that reads older states (``upgrade``). The translation and language-model iterators each
hold one record. Imports plan and below.
"""
