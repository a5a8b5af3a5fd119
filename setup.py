"""The optional compiled kernels (loader/_native/_gather.c, loader/_native/_plan.c); everything else is in pyproject.toml.

``optional=True``: where no C compiler is available the install goes on without them, and babelfeed gathers
and plans with numpy (the same batches, slower). -ffp-contract=off: the blend (Megatron's greedy) must round
every multiply and subtract as Megatron does, never fused.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("babelfeed._native._gather", ["loader/_native/_gather.c"], optional=True, extra_compile_args=["-O3", "-ffp-contract=off"]),
    Extension("babelfeed._native._plan", ["loader/_native/_plan.c", "loader/_native/_plan_rows.c",
                                        "loader/_native/_plan_order.c"], depends=["loader/_native/_plan.h"], optional=True,
              extra_compile_args=["-O3"]),
])
