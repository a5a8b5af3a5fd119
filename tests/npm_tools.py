"""Servers from npm that tests and benchmarks start (Azure's emulator Azurite; s3rver, an S3 server faster than
moto): installed on first use into the user's cache folder (``~/.cache/babelfeed-tests/NAME-VERSION``, renamed
into place when complete, one installer at a time), never into the checkout."""

import fcntl
import os
import shutil
import subprocess
import tempfile


class Unavailable(Exception):
    """The program cannot be had here (no node or npm, or npm could not install it): the reason."""


def npm_program(package: str, version: str, program: str, override: str | None = None) -> str:
    """The path of ``program`` of npm package ``package@version``: the one environment variable ``override``
    names, else the cached install, else installed now (~30 s, once). Raises :class:`Unavailable`."""
    named = os.environ.get(override or "") if override else None
    if named:
        return named
    home = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "babelfeed-tests")
    folder = os.path.join(home, f"{package}-{version}")
    path = os.path.join(folder, "node_modules", ".bin", program)
    if os.path.exists(path):
        return path
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise Unavailable(f"{package} installs with npm, and node or npm is not on this machine")
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, f"{package}-{version}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (xdist workers: one installs, the others wait for it)
        if not os.path.exists(path):
            part = tempfile.mkdtemp(prefix=f".{package}-", dir=home)
            try:
                subprocess.run([npm, "install", "--prefix", part, "--no-audit", "--no-fund", "--no-save",
                                "--loglevel=error", f"{package}@{version}"], check=True, timeout=600,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
                shutil.rmtree(part, ignore_errors=True)
                said = (getattr(e, "stderr", "") or str(e)).strip().splitlines()
                raise Unavailable(f"npm could not install {package}@{version}: {said[-1] if said else e}") \
                    from None
            os.rename(part, folder)
    return path
