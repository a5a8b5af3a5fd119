import json
import os
import pathlib
import sys
import tempfile

import pytest

# Property tests draw the same examples on every run (a CI result must not depend on the draw); explore new
# ones with HYPOTHESIS_PROFILE=explore.
from hypothesis import settings as _hypothesis_settings

_hypothesis_settings.register_profile("ci", derandomize=True)
_hypothesis_settings.register_profile("explore", derandomize=False)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Verification stamps of the test run go to a folder of its own (inherited by subprocesses), never ~/.cache;
# removed when the session ends (the process that made it: each xdist worker makes its own).
_OWN_CACHE = None
if "BABELFEED_CACHE_DIR" not in os.environ:
    _OWN_CACHE = os.environ["BABELFEED_CACHE_DIR"] = tempfile.mkdtemp(prefix="babelfeed-test-cache-")


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE is None or os.environ.get("BABELFEED_CACHE_DIR") != _OWN_CACHE:
        return
    import shutil

    try:
        from s3server import stop_fetcher
        stop_fetcher(_OWN_CACHE)  # (a fetcher a test started on this cache)
    except Exception:
        pass
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)

def pytest_terminal_summary(terminalreporter):
    """A store left untested on this machine (its emulator could not be installed) is said at the end, loudly:
    a skip in the middle of the dots is easy to miss."""
    untested = set()
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "UNTESTED" in reason:
            untested.add(reason.split("Skipped: ")[-1])
    for reason in sorted(untested):
        terminalreporter.write_sep("!", "NOT TESTED ON THIS MACHINE", red=True, bold=True)
        terminalreporter.write_line(reason, red=True, bold=True)


REPO = pathlib.Path(__file__).resolve().parent.parent

# The test folders mirror the packages (tests/plan for babelfeed.plan, ...); the helpers (synthetic, golden,
# helpers) live here. Every test folder and this one are on the path, in this process and (PYTHONPATH) in the
# subprocesses tests start, so a test or a child script imports a helper or another test module by its name.
TESTS = pathlib.Path(__file__).resolve().parent
FOLDERS = [str(TESTS)] + sorted(str(p) for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))
for _folder in reversed(FOLDERS):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)
os.environ["PYTHONPATH"] = os.pathsep.join(FOLDERS + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                      if p and p not in FOLDERS])


def shared_dir() -> pathlib.Path:
    """../shared beside the checkout (CI puts it there); BABELFEED_SHARED overrides."""
    path = pathlib.Path(os.environ.get("BABELFEED_SHARED", REPO.parent / "shared"))
    if not (path / "fixtures" / "expected.json").exists():
        # Fail, never skip: the compatibility claims rest on these files.
        raise RuntimeError(f"shared fixtures not found at {path}/fixtures; set BABELFEED_SHARED")
    return path


@pytest.fixture(scope="session")
def fixtures_dir() -> pathlib.Path:
    return shared_dir() / "fixtures"


@pytest.fixture(scope="session")
def expected(fixtures_dir) -> dict:
    return json.loads((fixtures_dir / "expected.json").read_text())


# No test forks the pytest process: it may have imported JAX (another test of the same worker did), whose threads
# may hold locks a forked child inherits, and the child then hangs. A fork (multiprocessing's "fork" context,
# torch's default DataLoader workers on Linux) is recorded here, and the test that made it fails; a test of a fork
# path runs it in a fresh interpreter (helpers.run_fresh). (subprocess starts programs without a Python fork.)
_FORKS_AFTER_JAX: list = []


def _note_fork() -> None:
    import traceback

    _FORKS_AFTER_JAX.append("".join(traceback.format_stack(limit=12)))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_note_fork)


@pytest.fixture(autouse=True)
def _no_fork_after_jax():
    _FORKS_AFTER_JAX.clear()
    yield
    if _FORKS_AFTER_JAX:
        where = _FORKS_AFTER_JAX[0]
        _FORKS_AFTER_JAX.clear()
        pytest.fail("this test forked the pytest process, which may have imported JAX (a forked child can hang on "
                    "a lock JAX's threads held): use multiprocessing_context='forkserver' or 'spawn', or run_fresh() for a "
                    f"test of the fork path (helpers.run_fresh). Forked from:\n{where}", pytrace=False)

