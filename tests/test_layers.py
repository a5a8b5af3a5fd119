"""The package's layers, read from its imports: every import (module level or inside a function) goes down the
layers or stays in its own, and no two modules import each other, directly or around a circle. The old flat
package maps to its folders in one line each: ``babelfeed.a.b`` is the file ``loader/a/b.py`` (``babelfeed.adapters.x``
is ``adapters/x.py``), with no alias for an old name."""

import ast
import importlib
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
LOADER = os.path.join(os.path.dirname(HERE), "loader")

# bottom to top; a module may import its own layer and those below
LAYERS = {
    "errors": 0, "fileio": 0, "stages": 0, "checks": 0, "permute": 0, "_native": 0,
    "storage": 1,
    "sources": 2,
    "plan": 3,
    "gather": 4,
    "run": 5,
    "iterators": 6,
    "lm": 7, "preprocess": 7,
    "config": 8,
    "build": 9,
    "tools": 10, "cli": 10,
    "__init__": 11,
}


def modules() -> dict:
    out = {}
    for folder, _, files in os.walk(LOADER):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), LOADER)[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(folder, f)
    return out


def imports(name: str, path: str, known: set) -> set:
    """The babelfeed modules ``name`` imports anywhere in its code."""
    tree = ast.parse(open(path).read())
    package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "babelfeed" or node.module.startswith("babelfeed.")):
                mod = node.module[len("babelfeed."):] if node.module != "babelfeed" else ""
            else:
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}" if mod else alias.name
                found.add(sub if sub in known else mod)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("babelfeed."):
                    found.add(alias.name[len("babelfeed."):])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args and \
                isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("babelfeed."):
            found.add(node.args[0].value[len("babelfeed."):])
    return {m for m in found if m and m != name and not name.startswith(m + ".") and m in known}


def layer(name: str) -> int:
    return LAYERS[name.split(".")[0]] if name else LAYERS["__init__"]


def graph() -> dict:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def test_every_module_has_a_layer():
    assert sorted(m for m in modules() if m.split(".")[0] not in LAYERS) == []


def test_imports_go_down_the_layers():
    up = sorted(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
                for a, deps in graph().items() if a != "__init__" for b in deps
                if layer(b) > layer(a) and not b.endswith("__init__"))
    assert up == []


def test_no_import_circles():
    g = {a: {b for b in deps if not (a.startswith(b + ".") or b == "")} for a, deps in graph().items()
         if a != "__init__"}
    # package faces (__init__) re-export lazily; circles are looked for between modules
    g = {a: {b for b in deps if b in g and b not in ("plan", "sources", "gather", "lm", "config", "storage",
                                                   "iterators", "tools", "preprocess", "_native")}
         for a, deps in g.items()}
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    assert circles == []


def test_the_core_imports_no_framework():
    """Importing every core module loads no torch, jax, flax or grain (a fresh interpreter)."""
    names = sorted(m for m in modules() if m and not m.endswith("__init__"))
    code = ("import sys, importlib\n" + "".join(f"importlib.import_module('babelfeed.{m}')\n" for m in names)
            + "bad = sorted(m for m in ('torch', 'jax', 'flax', 'grain') if m in sys.modules)\nprint(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_module_is_the_file_its_name_says():
    """``babelfeed.a.b`` is ``loader/a/b.py`` for every module of the core, and the other top folders map to
    ``babelfeed.adapters``, ``babelfeed.configs`` and ``babelfeed.examples``: one mapping line each, no alias."""
    import tomllib

    root = os.path.dirname(HERE)
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    assert mapping == {"babelfeed": "loader", "babelfeed.adapters": "adapters", "babelfeed.configs": "configs",
                       "babelfeed.examples": "examples"}
    for name in sorted(modules()):
        module = importlib.import_module(f"babelfeed.{name}" if name else "babelfeed")
        want = os.path.join(LOADER, *name.split(".")) if name else LOADER
        got = os.path.abspath(module.__file__)
        assert got in (want + ".py", os.path.join(want, "__init__.py")), (name, got)
    for folder in ("adapters", "configs", "examples"):
        module = importlib.import_module(f"babelfeed.{folder}")
        assert os.path.dirname(os.path.abspath(module.__file__)) == os.path.join(root, folder)
    # no finder answers for a name that is not a file
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("babelfeed.batches")
    import babelfeed
    assert not hasattr(babelfeed, "batches")


def test_the_public_names():
    import babelfeed
    from babelfeed.config import load_config, task  # noqa: F401  (the public babelfeed.config.task)

    assert babelfeed.SpikeGuard is importlib.import_module("babelfeed.iterators.policy").SpikeGuard
    out = subprocess.run([sys.executable, "-m", "babelfeed.cli", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "binarize" in out.stdout


def test_babelfeeds_errors_have_one_root_and_stay_what_they_were():
    """BabelfeedError roots every error class babelfeed defines; each stays the builtin it was (code catching
    ValueError, OSError or ImportError keeps working)."""
    import babelfeed
    from babelfeed.errors import MissingExtraError, UnsupportedDtypeError
    from babelfeed.errors import StateMismatch
    from babelfeed.errors import StateError
    from babelfeed.errors import BinarizeError
    from babelfeed.errors import TextInputError
    from babelfeed.storage.mapping import MappingError

    for cls, builtin in [(babelfeed.ConfigError, ValueError), (babelfeed.FormatError, ValueError),
                         (StateError, ValueError), (StateMismatch, ValueError), (BinarizeError, ValueError),
                         (TextInputError, ValueError), (UnsupportedDtypeError, ValueError), (MappingError, OSError),
                         (MissingExtraError, ImportError)]:
        assert issubclass(cls, babelfeed.BabelfeedError) and issubclass(cls, builtin), cls
    cfg = babelfeed.load_config("nllb_like")
    cfg.mixing.temperature = 0.0
    from babelfeed.config.spec import parse

    with pytest.raises(babelfeed.ConfigError, match="mixing.temperature"):
        parse(cfg)


def test_imports_are_at_the_top_unless_their_line_says_why():
    """What a file needs is said at its top: an import inside a function carries a comment on its line saying why
    (an optional dependency, a cost paid only where it is used)."""
    found = []
    for base in (LOADER, os.path.join(os.path.dirname(HERE), "adapters")):
        for folder, _, files in os.walk(base):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(folder, f)
                text = open(path).read()
                lines = text.split("\n")
                for fn in ast.walk(ast.parse(text)):
                    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        for node in ast.walk(fn):
                            if isinstance(node, (ast.Import, ast.ImportFrom)) and "#" not in lines[node.lineno - 1]:
                                found.append(f"{os.path.relpath(path, os.path.dirname(HERE))}:{node.lineno}: "
                                             f"{lines[node.lineno - 1].strip()}")
    assert found == []
