"""Old import paths that keep working after the modules moved into the layer packages.

* ``babelfeed.<old module>`` (``babelfeed.batches``, ``babelfeed.ledger``, ...) imports the module it became, the
  same object, through a finder on ``sys.meta_path`` (``MOVED`` in ``babelfeed/__init__``);
* a package that took an old module's name (``babelfeed.plan`` was a module, now a package) gives that module's
  names when asked for them (:func:`former_module`), without loading it when only a submodule is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


def former_module(package: str, module: str):
    """A module ``__getattr__`` for ``package``: a submodule by its name, else a name of ``package.module``."""

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if importlib.util.find_spec(f"{package}.{name}") is not None:  # a submodule
            return importlib.import_module(f"{package}.{name}")
        try:
            return getattr(importlib.import_module(f"{package}.{module}"), name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``babelfeed.<old name>`` as the module it became (``moved``: old name -> new dotted name)."""

    def __init__(self, moved: dict):
        self.moved = moved

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("babelfeed.") and fullname[len("babelfeed."):] in self.moved:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module("babelfeed." + self.moved[spec.name[len("babelfeed."):]])

    def exec_module(self, module):
        pass


def install(moved: dict) -> None:
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules(moved))
