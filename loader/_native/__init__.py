"""The optional compiled kernels, loaded once: ``_gather`` (the gather, Megatron's blend) and ``_plan`` (the
planner's sorts, draws and orders). Each is None where it was not built (no C compiler at install time) or
``BABELFEED_KERNEL=0`` is set; every caller then takes its numpy path, which gives the same arrays.

``plan_kernel`` wraps ``_plan`` for the planners (threads, fallbacks).
"""

from __future__ import annotations

import os


def _load(name: str):
    try:
        return __import__(f"babelfeed._native.{name}", fromlist=[name])
    except ImportError:
        return None


_OFF = os.environ.get("BABELFEED_KERNEL", "1") == "0"
GATHER = None if _OFF else _load("_gather")
PLAN = None if _OFF else _load("_plan")
