"""Object stores: ``s3://``, ``gs://``, ``az://`` and ``http(s)://`` objects read by range, with retries and errors
that name the object, the range and what went wrong.

Built on obstore (Rust's ``object_store``; ``pip install 'babelfeed[s3]'``), chosen by measurement: against the
same local S3 server, a ranged GET cost 0.47 ms of client CPU with obstore and 1.85 ms with boto3 (400 reads of
500 bytes; ``benchmarks/bench_remote.py``). On a 2-core host that feeds an accelerator, the loader's CPU is the
budget. obstore's runtime does not survive ``fork`` (a child that touches it hangs, even with a store of its
own), so this module is used only inside the host's fetcher process (``storage/remote/server.py``), which is started
fresh, never forked from a process that used it. Every other process reads the fetched bytes from local files.

Credentials and endpoints come the way every S3 tool takes them: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``/``AWS_REGION``, ``AWS_ALLOW_HTTP=true``
for a plain-http endpoint (a store on the LAN or the loopback), and ``AWS_PROFILE`` or the profile files (through
boto3's credential chain, when boto3 is installed); GCS and Azure take their SDKs' variables (and
``GOOGLE_ALLOW_HTTP``, ``AZURE_ALLOW_HTTP``). The options of a
config's ``data.storage`` section override them. No credential is ever logged or put in a message.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import random
import re
import threading
import time
from datetime import timedelta

from babelfeed.errors import DataChangedError, InternalError, StoreError, UsageError, redact
from babelfeed.storage.remote.limits import _endpoint


SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "http", "https")
_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://([^/]+)(?:/(.*))?$")

# How long a request may keep failing (5xx, throttling, timeouts, dropped connections) before it is an error:
# retries with exponential backoff and jitter inside this bound, then one error naming the object and range.
# (BABELFEED_FETCH_RETRY_SECONDS sets the bound)
RETRY_SECONDS = float(os.environ.get("BABELFEED_FETCH_RETRY_SECONDS", 120.0))
MAX_RETRIES = 10
BACKOFF = float(os.environ.get("BABELFEED_FETCH_BACKOFF_MS", 100)) / 1e3  # the first retry's wait (then doubling)


def is_remote(path) -> bool:
    """Whether ``path`` names an object store (``s3://bucket/prefix``) rather than a local path."""
    m = _URL.match(str(path))
    return bool(m) and m.group(1) in SCHEMES


def split_url(url: str) -> tuple[str, str]:
    """``("s3://bucket", "prefix/path")`` of an object URL (the key without leading or trailing slashes)."""
    m = _URL.match(str(url))
    if not m or m.group(1) not in SCHEMES:
        raise UsageError(f"{url!r} is not an object store URL ({', '.join(s + '://' for s in SCHEMES)})")
    return f"{m.group(1)}://{m.group(2)}", (m.group(3) or "").strip("/")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


# the environment a store is configured from (obstore reads it; AZURITE_BLOB_STORAGE_URL: Azure's emulator)
STORE_ENV = ("AWS_", "GOOGLE_", "AZURE_", "AZURITE_")
_env_lock = threading.Lock()


def store_env() -> dict:
    """This process's store environment (what a store it asks the host's fetcher for is configured from)."""
    return {k: v for k, v in os.environ.items() if k.startswith(STORE_ENV)}


def _store(root: str, options: dict | None, env: dict | None = None):
    """An obstore store for ``root`` (scheme://bucket), configured from the environment and ``options``. ``env``:
    the store environment of the process that asks (the fetcher serves every process of the host, each with its
    own endpoint and credentials), in place of this one's while the store is built."""
    if env is None:
        return _build_store(root, options)
    with _env_lock:
        saved = store_env()
        for k in saved:
            del os.environ[k]
        os.environ.update(env)
        try:
            return _build_store(root, options)
        finally:
            for k in env:
                os.environ.pop(k, None)
            os.environ.update(saved)


def store_kind(root: str) -> str:
    """Which store ``root`` (``scheme://bucket``) is: ``"s3"``, ``"gs"``, ``"az"`` (also ``abfs``/``abfss``) or
    ``"http"`` (also ``https``)."""
    scheme = root.split("://")[0]
    return {"s3a": "s3", "abfs": "az", "abfss": "az", "https": "http"}.get(scheme, scheme)


def allow_http_variable(root: str) -> str:
    """The environment variable that allows a plain-http endpoint for ``root``'s store (each store's prefix)."""
    return {"gs": "GOOGLE_ALLOW_HTTP", "az": "AZURE_ALLOW_HTTP"}.get(store_kind(root), "AWS_ALLOW_HTTP")


def _build_store(root: str, options: dict | None):
    try:
        from obstore.store import from_url  # optional: babelfeed[s3]
    except ImportError:
        raise StoreError(f"{root}: reading an object store needs obstore: pip install 'babelfeed[s3]'") \
            from None
    opts = {k: v for k, v in dict(options or {}).items() if v not in (None, "")}
    client = {"timeout": opts.pop("timeout", "60s"), "connect_timeout": opts.pop("connect_timeout", "5s")}
    allow_http = opts.pop("allow_http", None)
    if allow_http is None:
        allow_http = _env_flag(allow_http_variable(root))
    client["allow_http"] = bool(allow_http)
    retry = {"max_retries": MAX_RETRIES, "retry_timeout": timedelta(seconds=RETRY_SECONDS),
             "backoff": {"init_backoff": timedelta(seconds=BACKOFF), "max_backoff": timedelta(seconds=10),
                         "base": 2}}
    kwargs = {}
    if store_kind(root) == "s3":
        endpoint = opts.pop("endpoint", None) or os.environ.get("AWS_ENDPOINT_URL_S3") or \
            os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            opts["endpoint"] = endpoint
        region = opts.pop("region", None) or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            opts["region"] = region
        if not os.environ.get("AWS_ACCESS_KEY_ID") and "access_key_id" not in opts and (
                os.environ.get("AWS_PROFILE") or opts.get("profile")):
            kwargs["credential_provider"] = _profile_credentials(root, opts.pop("profile", None))
        opts.pop("profile", None)
    try:
        return from_url(root, config=opts or None, client_options=client, retry_config=retry, **kwargs)
    except Exception as e:  # a bad option or URL: obstore's message names the key, not a secret
        raise StoreError(f"{root}: cannot configure the store: {_first_line(e)}") from None


def _profile_credentials(root: str, profile: str | None):
    try:
        import boto3  # optional: a test extra
        from obstore.auth.boto3 import Boto3CredentialProvider  # optional: babelfeed[s3]
    except ImportError:
        raise StoreError(f"{root}: AWS_PROFILE is set, and reading profiles needs boto3: pip install boto3 "
                               f"(or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)") from None
    return Boto3CredentialProvider(boto3.Session(profile_name=profile) if profile else boto3.Session())


def _set_credentials(root: str) -> str:
    """How credentials are given for ``root``'s store."""
    kind = store_kind(root)
    if kind == "gs":
        return "set GOOGLE_SERVICE_ACCOUNT (a service-account file) or the application-default credentials"
    if kind == "az":
        return ("set AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or a SAS token, or "
                "AZURE_STORAGE_USE_EMULATOR=true for Azurite)")
    return "set them as for any S3 tool (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE) or in data.storage"


def _first_line(e: BaseException) -> str:
    text = redact(str(e)).strip().splitlines()
    return text[0][:400] if text else type(e).__name__


class _CutShort(Exception):
    """A body that ended before its length (the connection closed early): retried."""


def _transient_body(e: BaseException) -> bool:
    """Whether ``e`` is a body cut short after the answer began (obstore retries failed requests itself, not a
    body that breaks off once its headers came)."""
    if isinstance(e, _CutShort):
        return True
    text = str(e).lower()
    return any(x in text for x in ("body error", "error decoding response body", "connection closed",
                                   "connection reset", "unexpected eof", "incomplete", "content-range"))


_INVALID_KEY = re.compile(r'(?:Error parsing Path|Path) "((?:[^"\\]|\\.)*)"')


class Store:
    """One object store (``scheme://bucket``): the requests babelfeed makes, each failure one clear error."""

    def __init__(self, root: str, options: dict | None = None, env: dict | None = None):
        self.root = root
        self._options = options
        self._env = env
        self._store = None
        self.requests = 0
        self.bytes = 0
        self.retried = 0  # bodies cut short and asked for again
        self.notices: list[str] = []  # what a listing skipped, said to the process that asked (once)
        self.latencies: list[float] = []  # seconds per ranged request (the fetcher keeps the last 10,000)

    @property
    def store(self):
        if self._store is None:
            self._store = _store(self.root, self._options, self._env)
        return self._store

    def url(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _explain(self, e: BaseException, key: str, what: str) -> Exception:
        import obstore.exceptions as ox  # optional: babelfeed[s3]

        url = self.url(key)
        if isinstance(e, ox.PreconditionError):
            return DataChangedError(url, f"changed in the store while the job reads it ({what}: its ETag is no longer "
                                         f"the one the job opened): the rest of the run would mix two versions. "
                                         f"Restart from the last saved state")
        if isinstance(e, ox.NotFoundError):
            return StoreError(f"{url}: no such object ({what})")
        if isinstance(e, (ox.UnauthenticatedError, ox.PermissionDeniedError)):
            return StoreError(f"{self.root}: credentials missing or refused ({what} {url}); "
                              f"{_set_credentials(self.root)}")
        text = str(e)
        status = re.search(r"status code: (\d{3})", text)
        code = int(status.group(1)) if status else None
        if code == 404 or "NoSuchBucket" in text:
            if "NoSuchBucket" in text or "list" in what:
                kind = "container" if store_kind(self.root) == "az" else "bucket"
                return StoreError(f"{self.root}: no such {kind} ({what} {url})")
            return StoreError(f"{url}: no such object ({what})")
        if code in (401, 403):
            return StoreError(f"{self.root}: credentials missing or refused ({what} {url}: HTTP {code}); "
                                    f"{_set_credentials(self.root)}")
        if "builder error" in text and "http://" in text:
            return StoreError(f"{self.root}: the endpoint is plain http: set {allow_http_variable(self.root)}=true "
                                    f"(or data.storage.allow_http) to allow it ({what} {url})")
        if "169.254.169.254" in text or "credential" in text.lower():
            return StoreError(f"{self.root}: no credentials found ({what} {url}); {_set_credentials(self.root)}")
        retried = re.search(r"after (\d+) retries", text)
        how = f"after {retried.group(1)} retries" if retried else "failed"
        if "error sending request" in text:
            return StoreError(f"{url}: {what}: the store does not answer ({how}, at most {MAX_RETRIES} "
                                    f"within {RETRY_SECONDS:.0f} s): {_first_line(e)}")
        return StoreError(f"{url}: {what} failed ({how}; retries: at most {MAX_RETRIES} within "
                                f"{RETRY_SECONDS:.0f} s): {_first_line(e)}")

    def head(self, key: str) -> tuple[int, str]:
        """``(size, etag)`` of an object."""
        import obstore  # optional: babelfeed[s3]

        try:
            meta = obstore.head(self.store, key)
        except Exception as e:
            raise self._explain(e, key, "reading its metadata") from None
        self.requests += 1
        return int(meta["size"]), str(meta.get("e_tag") or meta.get("version") or "")

    def list(self, prefix: str) -> list[tuple[str, int, str]]:
        """``(key, size, etag)`` of every object under ``prefix`` (recursively). A key the client library cannot
        take (an empty segment, ``a//b``, or a ``.``/``..`` one: stray keys an upload script left) is skipped with a
        warning naming it, where the store is listed again without that library (S3, with boto3 installed);
        elsewhere it is an error naming the key and the fix."""
        import obstore  # optional: babelfeed[s3]

        out = []
        try:
            for chunk in obstore.list(self.store, prefix=prefix.rstrip("/") + "/" if prefix else None):
                self.requests += 1
                for meta in chunk:
                    out.append((str(meta["path"]), int(meta["size"]), str(meta.get("e_tag") or "")))
        except Exception as e:
            bad = _INVALID_KEY.search(str(e)) if "path" in str(e).lower() else None
            if bad is None:
                raise self._explain(e, prefix, "listing") from None
            return self._list_around(prefix, bad.group(1))
        return out

    def _list_around(self, prefix: str, bad: str) -> list[tuple[str, int, str]]:
        """:meth:`list` of a prefix holding keys obstore refuses (``bad``, the first): S3's listing read through
        boto3, every key kept as it is but those, which are skipped with a warning naming them."""
        kind = store_kind(self.root)
        tool = {"gs": f"gcloud storage mv '{self.url(bad)}' ...",
                "az": f"az storage blob delete --container-name {self.root.split('://', 1)[1]} --name '{bad}'"}
        fix = (f"delete or rename it (it is not babelfeed's: an empty or '.'/'..' path segment), e.g. "
               f"{tool.get(kind, f'aws s3 mv {self.url(bad)!r} ...')}")
        if kind != "s3":
            raise StoreError(f"{self.url(prefix)}: the listing holds the key {bad!r}, which the store client "
                             f"cannot read: {fix}")
        try:
            import boto3  # optional: lists a folder holding such keys
        except ImportError:
            raise StoreError(f"{self.url(prefix)}: the listing holds the key {bad!r}, which the store client "
                             f"cannot read: {fix}; or pip install boto3, and such keys are skipped with a "
                             f"warning") from None
        env = self._env if self._env is not None else dict(os.environ)
        opts = dict(self._options or {})
        endpoint = _endpoint(opts, env) or None
        session = boto3.session.Session(
            aws_access_key_id=opts.get("access_key_id") or env.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=opts.get("secret_access_key") or env.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=opts.get("token") or env.get("AWS_SESSION_TOKEN"),
            region_name=opts.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            profile_name=opts.get("profile") or env.get("AWS_PROFILE") or None)
        bucket = self.root.split("://", 1)[1]
        out, skipped = [], []
        try:
            pages = session.client("s3", endpoint_url=endpoint).get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix.rstrip("/") + "/" if prefix else "")
            for page in pages:
                self.requests += 1
                for meta in page.get("Contents", []):
                    key = meta["Key"]
                    parts = key.split("/")
                    if key.endswith("/"):
                        continue  # (a folder marker: a console's "create folder")
                    if any(p in ("", ".", "..") for p in parts):
                        skipped.append(key)
                        continue
                    out.append((key, int(meta["Size"]), str(meta.get("ETag") or "")))
        except Exception as e:
            raise StoreError(f"{self.url(prefix)}: listing (through boto3: the listing holds the key {bad!r}) "
                             f"failed: {_first_line(e)}") from None
        shown = ", ".join(repr(k) for k in skipped[:5]) + (f" and {len(skipped) - 5:,} more" if len(skipped) > 5
                                                           else "")
        self.notices.append(f"{self.url(prefix)}: skipped {len(skipped):,} stray key{'s' * (len(skipped) != 1)} "
                            f"(an empty or '.'/'..' path segment, not a data folder's): {shown}")
        return out

    async def get_async(self, key: str, etag: str | None = None, size: int | None = None) -> bytes:
        """A whole (small) object, refused when its ETag is no longer ``etag``; a body that ends before ``size``
        bytes is asked for again (the fetcher fetches many at once)."""
        return await self._get(key, None, etag, size, "reading it")

    async def get_range_async(self, key: str, a: int, b: int, etag: str | None) -> bytes:
        """The bytes ``[a, b)`` of an object, checked whole and against ``etag`` (an object replaced in the store
        is refused by name, never mixed with what was read of it before)."""
        t0 = time.perf_counter()
        data = await self._get(key, (a, b), etag, b - a, f"reading bytes [{a:,}, {b:,})")
        self.latencies.append(time.perf_counter() - t0)
        return data

    async def _get(self, key: str, span, etag: str | None, size: int | None, what: str) -> bytes:
        """One GET, whole or ``span``, its body read whole: a body cut short (the connection closed before its
        length, a transfer error once the answer began) is asked for again with backoff, up to ``MAX_RETRIES``
        times within ``RETRY_SECONDS`` (obstore retries the requests that fail before their answer). A short
        body is never served."""
        import obstore  # optional: babelfeed[s3]

        options = {**({"range": span} if span else {}), **({"if_match": etag} if etag else {})}
        deadline = time.monotonic() + RETRY_SECONDS
        for attempt in range(MAX_RETRIES + 1):
            try:
                got = await obstore.get_async(self.store, key, options=options or None)
                data = bytes(await got.bytes_async())
                if size is not None and len(data) != size:
                    raise _CutShort(f"the body ended after {len(data):,} of its {size:,} bytes")
            except Exception as e:
                transient = _transient_body(e)
                if not transient or attempt == MAX_RETRIES or time.monotonic() >= deadline:
                    if transient:
                        raise StoreError(
                            f"{self.url(key)}: {what}: the connection closed before the body's end on each of "
                            f"{attempt + 1} tries within {RETRY_SECONDS:.0f} s (a network or store fault; "
                            f"BABELFEED_FETCH_RETRY_SECONDS sets the bound): {_first_line(e)}; nothing of it is "
                            f"kept") from None
                    raise self._explain(e, key, what) from None
                self.retried += 1
                await asyncio.sleep(min(BACKOFF * 2 ** attempt, 10.0) * (0.5 + random.random() / 2))
                continue
            self.requests += 1
            self.bytes += len(data)
            return data
        raise InternalError("the retry loop ended without an answer or an error")

    def delete(self, key: str) -> None:
        import obstore  # optional: babelfeed[s3]

        try:
            obstore.delete(self.store, key)
        except Exception as e:
            raise self._explain(e, key, "deleting it") from None
        self.requests += 1

    def put_file(self, key: str, path: str) -> int:
        """Upload local file ``path`` as object ``key`` (multipart when large; the object appears whole or not at
        all). Returns its size."""
        import obstore  # optional: babelfeed[s3]

        try:
            obstore.put(self.store, key, pathlib.Path(path))
        except Exception as e:
            raise self._explain(e, key, f"writing it from {path}") from None
        self.requests += 1
        return os.path.getsize(path)
