"""The optional compiled gather kernel (loader/_gather.c); everything else is in pyproject.toml.

``optional=True``: where no C compiler is available the install goes on without it, and babelfeed gathers with
numpy (the same batches, slower).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("loader._gather", ["loader/_gather.c"], optional=True, extra_compile_args=["-O3"])])
