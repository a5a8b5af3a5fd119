"""Layer 3, plan: pure planners from integer arrays to integer arrays (what is drawn, in which order, cut into
which batches of which shape). No token is read here.

``mixing`` (temperature sampling, samplers), ``batching`` and ``cutting`` (token budgets, fairseq's
batch_by_size), ``shapes``/``shape_boxes`` (static shapes), ``packing``, ``schedule`` (mixing schedules),
``options`` (PlanOptions), ``planner`` (EpochPlanner: an epoch's windows), ``stream`` (the stream sampler's
windows), ``samples`` (planned samples), ``bins`` (a length-bin sampler for torch). Imports sources and below.
"""
