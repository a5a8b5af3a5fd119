"""babelfeed.errors: every error a user can cause is a BabelfeedError subclass, raised by its type, and keeps its
type across a process boundary; the command line tells the user's mistakes from babelfeed's bugs by type alone."""

import ast
import inspect
import os
import pickle

import pytest

import babelfeed
from babelfeed import errors

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILTIN = {"ValueError", "KeyError", "TypeError", "IndexError", "RuntimeError", "Exception", "LookupError",
           "AssertionError"}


def sources(*folders):
    for folder in folders:
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(base, f)


def test_no_builtin_error_is_raised_where_a_user_meets_it():
    """No ``raise ValueError/KeyError/TypeError/...`` in loader/ or adapters/: an error a user can cause is a
    BabelfeedError subclass (which also derives from the builtin that older code caught); an invariant of our own
    is an InternalError."""
    found = []
    for path in sources("loader", "adapters"):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(exc, ast.Name) and exc.id in BUILTIN:
                    found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: raise {exc.id}")
    assert found == []


def test_the_tests_expect_babelfeed_errors_not_builtins():
    """A test of bad input names the error it expects by its babelfeed type (``pytest.raises(ConfigError)``), so
    that a bad input answered with a bare ValueError (a bug, by the CLI's reckoning) fails the test. A test of
    what is not babelfeed's to type (Python refusing an abstract class, a compiled kernel's own bounds check under
    the checked API, the test's own error passing through) says so on its line: ``# not babelfeed's: why``."""
    found = []
    for path in sources("tests"):
        text = open(path).read()
        lines = text.split("\n")
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "raises"
                    and node.args):
                first = node.args[0]
                names = first.elts if isinstance(first, ast.Tuple) else [first]
                bad = [n.id for n in names if isinstance(n, ast.Name) and n.id in BUILTIN]
                if bad and "# not babelfeed's:" not in lines[node.lineno - 1]:
                    found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: pytest.raises({', '.join(bad)})")
    assert found == []


def error_classes():
    return [c for _, c in inspect.getmembers(errors, inspect.isclass)
            if issubclass(c, BaseException) and c.__module__ == errors.__name__]


@pytest.mark.parametrize("cls", error_classes(), ids=lambda c: c.__name__)
def test_each_error_is_made_from_its_message_and_keeps_its_type_across_processes(cls):
    """What a worker process raises arrives with its type: pickling (multiprocessing, grain's workers) and torch's
    DataLoader, which re-raises a worker's error as ``type(e)(message)``."""
    e = cls("data_bin/train.en-de.en: the message")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and str(back) == str(e)
    again = cls(f"Caught {cls.__name__} in DataLoader worker process 0.\nOriginal {e}")
    assert isinstance(again, cls) and "the message" in str(again)


def test_the_families():
    """Every error a user can cause is under BabelfeedError and under the builtin older code caught."""
    for cls in (errors.UsageError, errors.ConfigError, errors.DataError, errors.StateError, errors.FormatError):
        assert issubclass(cls, errors.BabelfeedError) and issubclass(cls, ValueError)
    for cls in (errors.StateMismatch, errors.HistoryError, errors.SkipError):
        assert issubclass(cls, errors.StateError)
    assert issubclass(errors.FormatError, errors.DataError)
    assert issubclass(errors.UsageTypeError, TypeError) and issubclass(errors.ConfigTypeError, TypeError)
    assert issubclass(errors.OutOfRange, IndexError) and issubclass(errors.UnknownConfigKey, KeyError)
    assert issubclass(errors.StoreError, OSError) and issubclass(errors.WorkerDied, errors.BabelfeedError)
    assert issubclass(errors.MissingExtraError, ImportError)
    assert not issubclass(errors.InternalError, errors.BabelfeedError)
    for cls in error_classes():
        if cls not in (errors.InternalError, errors.Terminated) and not issubclass(cls, errors.Notice):
            assert issubclass(cls, errors.BabelfeedError), cls
        if issubclass(cls, errors.BabelfeedError):
            assert cls.__name__ in babelfeed.__all__ or issubclass(cls, errors.FormatError), cls


def test_the_command_line_decides_by_type():
    from babelfeed.tools.cli import is_user_error

    assert is_user_error(errors.ConfigError("mixing.temperature must be > 0"))
    assert is_user_error(FileNotFoundError(2, "No such file or directory", "data_bin/dict.txt"))
    assert is_user_error(errors.StoreError("s3://b/x: 403"))
    for bug in (ValueError("x"), KeyError("x"), TypeError("x"), IndexError("x"), errors.InternalError("x")):
        assert not is_user_error(bug)
