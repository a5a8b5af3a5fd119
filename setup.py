"""The packages, found in the folders pyproject.toml maps (babelfeed.a.b is loader/a/b.py), and the optional compiled
kernels (loader/_native/_gather.c, loader/_native/_plan.c); everything else is in pyproject.toml.

``optional=True``: where no C compiler is available the install goes on without them, and babelfeed gathers
and plans with numpy (the same batches, slower). -ffp-contract=off: the blend (Megatron's greedy) must round
every multiply and subtract as Megatron does, never fused.
"""

import tomllib

from setuptools import Extension, find_packages, setup

# import name prefix -> folder: pyproject.toml's [tool.setuptools.package-dir], its one home
with open("pyproject.toml", "rb") as f:
    FOLDERS = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
PACKAGES = sorted({prefix for prefix in FOLDERS}
                  | {f"{prefix}.{sub}" for prefix, folder in FOLDERS.items() for sub in find_packages(folder)})

setup(packages=PACKAGES, ext_modules=[
    Extension("babelfeed._native._gather", ["loader/_native/_gather.c"], optional=True, extra_compile_args=["-O3", "-ffp-contract=off"]),
    Extension("babelfeed._native._plan", ["loader/_native/_plan.c", "loader/_native/_plan_rows.c",
                                        "loader/_native/_plan_order.c", "loader/_native/_plan_copies.c"], depends=["loader/_native/_plan.h"], optional=True,
              extra_compile_args=["-O3"]),
])
