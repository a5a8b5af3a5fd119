import json
import os
import pathlib
import tempfile

import pytest

# Property tests draw the same examples on every run (a CI result must not depend on the draw); explore new
# ones with HYPOTHESIS_PROFILE=explore.
from hypothesis import settings as _hypothesis_settings

_hypothesis_settings.register_profile("ci", derandomize=True)
_hypothesis_settings.register_profile("explore", derandomize=False)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Verification stamps of the test run go to a folder of its own (inherited by subprocesses), never ~/.cache.
os.environ.setdefault("BABELFEED_CACHE_DIR", tempfile.mkdtemp(prefix="babelfeed-test-cache-"))

REPO = pathlib.Path(__file__).resolve().parent.parent


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
