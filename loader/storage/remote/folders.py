"""The folders the host's fetcher mirrors (:class:`Folders`): each remote folder's stores (one per endpoint and
credentials), its shadow and manifest, the small files fetched whole, and the checks of its objects against the
store each epoch. The fetcher (``server.py``) owns the ``.bin`` shadows' bytes: what is held, asked for, and
evicted.
"""

from __future__ import annotations

import json
import os
import threading

from babelfeed.errors import DataChangedError
from babelfeed.storage.remote import limits
from babelfeed.storage.remote.limits import _endpoint, shadow_root
from babelfeed.storage.remote.objects import Store, StoreError, split_url
from babelfeed.storage.remote.pieces import RemoteFile


class Folders:
    """The remote folders of one fetcher (``fetcher``: its ``.bin`` files, lock and network)."""

    def __init__(self, fetcher):
        self.fetcher = fetcher
        self.cache = fetcher.cache
        self.lock = threading.Lock()
        self.stores: dict = {}
        self.mirror_locks: dict[str, threading.Lock] = {}
        self.checked: set = set()  # (shadow folder, epoch) whose objects were checked against the store
        self.fresh: set = set()  # shadow folders just mirrored: that listing is the next epoch's check

    def store(self, root: str, options: dict | None, env: dict | None = None):
        """The store for ``root`` as a process configures it: its options, and its store environment (``env``;
        None: this process's). Processes with other endpoints or credentials get stores of their own."""
        key = (root, json.dumps(options or {}, sort_keys=True), json.dumps(env, sort_keys=True))
        with self.lock:
            if key not in self.stores:
                self.stores[key] = Store(root, options, env)
            return self.stores[key]

    def mirror(self, url: str, options: dict | None = None, env: dict | None = None) -> dict:
        """The shadow folder of remote folder ``url``, brought up to date with the store: small files fetched whole
        (kept while size and ETag hold), each ``.bin`` a sparse file of its size (a new file when its ETag
        changed, so nothing fetched from the old object is ever read as the new one's). Returns ``{"path": the
        shadow, "notices": what the asking process should be told}`` (stray keys skipped)."""
        url = url.rstrip("/")
        root, prefix = split_url(url)
        store = self.store(root, options, env)
        local = shadow_root(self.cache, url, _endpoint(options, env))
        with self.lock:
            lock = self.mirror_locks.setdefault(local, threading.Lock())
        with lock:
            os.makedirs(local, mode=0o700, exist_ok=True)
            manifest_path = os.path.join(local, ".manifest.json")
            manifest = _manifest(local)
            objects = store.list(prefix)
            notices, store.notices = list(store.notices), []
            if not objects:
                raise StoreError(f"{url}: no objects under this prefix (a data folder holds dict.txt and "
                                       f".idx/.bin files)")
            rels = [key[len(prefix):].lstrip("/") if prefix else key for key, _, _ in objects]
            folders = {r.rsplit("/", i)[0] for r in rels for i in range(1, r.count("/") + 1)}
            new_manifest = {}
            wanted = []  # small files to fetch whole
            bins = []  # (.bin path, key, size, etag, whether its shadow is new)
            for (key, size, etag), rel in zip(objects, rels):
                if not rel or rel.startswith(".") or "/." in rel or ".." in rel.split("/"):
                    continue
                if size == 0 and (rel in folders or key.endswith("/")):
                    continue  # a folder marker (the S3 console's "create folder": a key ending in "/")
                path = os.path.join(local, rel)
                known = manifest.get(rel)
                same = known is not None and known["size"] == size and known["etag"] == etag and os.path.exists(path)
                if rel.endswith(".bin"):
                    bins.append((path, key, size, etag, not same or os.path.getsize(path) != size))
                elif not same:
                    if size > limits.SMALL_FILE:
                        continue  # (a large file babelfeed does not read: not mirrored)
                    wanted.append((key, etag, size, path))
                new_manifest[rel] = {"size": size, "etag": etag}
            for sub in sorted({os.path.dirname(os.path.join(local, rel)) for rel in new_manifest}):
                os.makedirs(sub, mode=0o700, exist_ok=True)
            # the small files (a thousand directions' indexes) fetched many at once, while the .bin shadows are
            # made here: each waits on the other otherwise
            fetching = self.fetcher.network.start(_all_whole(self.fetcher, store, [w for w in wanted if w[2]]))
            try:
                for key, etag, size, path in wanted:
                    if size == 0:  # (nothing to fetch)
                        open(path, "wb").close()
                for path, key, size, etag, new in bins:
                    if new:
                        tmp = f"{path}.{os.getpid()}.partial"
                        with open(tmp, "wb") as f:
                            f.truncate(size)  # sparse: blocks are written as ranges are fetched
                        os.replace(tmp, path)  # a new inode: a reader of the old object's file keeps its own
                    with self.fetcher.lock:
                        current = old = self.fetcher.remotes.get(path)
                        if new or current is None or current.etag != etag or current.size != size:  # (a new
                            # shadow file is a new RemoteFile whatever its ETag: the old one's fd is the replaced
                            # file's, and after a mirror that failed part way, bytes fetched there were lost)
                            self.fetcher.remotes[path] = RemoteFile(store, key, size, etag, path)
                        else:
                            old = None
                        self.fetcher.remotes[path].folder = (store, prefix, local)
                    if old is not None:  # (its descriptor and bytes given back: outside the fetcher's lock, which
                        # comes after a file's)
                        self.fetcher.retire(old)
            except BaseException:
                try:  # (the fetches end before the error here is raised, theirs unsaid)
                    fetching.result()
                except BaseException:
                    pass
                raise
            fetching.result()  # (its first failure raised)
            for rel in set(manifest) - set(new_manifest) - {""}:  # gone from the store: gone from the shadow too
                # (a warm cache served a deleted direction's cached rows to a new job; a process that has the file
                # open keeps its inode, and its next fetch there or its next epoch's check refuses the object)
                path = os.path.join(local, rel)
                try:
                    os.unlink(path)
                except OSError:
                    pass
            tmp = f"{manifest_path}.{os.getpid()}.partial"
            with open(tmp, "w") as f:
                json.dump({**new_manifest, **{"": {"url": url, "size": 0, "etag": ""}}}, f)
            os.replace(tmp, manifest_path)
        with self.lock:
            self.fresh.add(local)
        return {"path": local, "notices": notices}

    def listing(self, url: str, options: dict | None = None, env: dict | None = None) -> dict:
        """``{"files": [[name, size], ...]}``: the objects under remote folder ``url``, named relative to it."""
        root, prefix = split_url(url.rstrip("/"))
        got = self.store(root, options, env).list(prefix)
        cut = len(prefix) + 1 if prefix else 0
        return {"files": [[key[cut:], size] for key, size, _ in got]}

    def delete(self, url: str, options: dict | None = None, env: dict | None = None) -> dict:
        root, key = split_url(url)
        self.store(root, options, env).delete(key)
        return {}

    def upload(self, url: str, path: str, options: dict | None = None, env: dict | None = None) -> dict:
        """Write local file ``path`` to object ``url``."""
        bucket, key = split_url(url)
        return {"bytes": self.store(bucket, options, env).put_file(key, path)}

    def check_unchanged(self, paths: list, epoch) -> None:
        """Each epoch (a process's ``plan``): the objects of ``paths`` (shadow ``.bin`` files) and their ``.idx`` are
        looked up in the store again (one listing per folder and epoch for the host: its ranks share it; the first
        epoch after a mirror is checked by the mirror's listing), and one
        replaced or removed since the job opened it is refused by name, whether or not its bytes are cached: the
        epoch would mix two versions of the data."""
        folders: dict = {}
        for p in paths:
            r = self.fetcher.remotes[p]
            if getattr(r, "folder", None) is not None:
                folders.setdefault(r.folder[2], (r.folder, []))[1].append(r)
        for local, ((store, prefix, _), files) in folders.items():
            with self.lock:
                fresh = local in self.fresh  # (the listing a process's mirror made a moment ago, when it opened
                # the folder: the first epoch it plans is checked by it; a later one lists again)
                self.fresh.discard(local)
                if (local, epoch) in self.checked:
                    continue
                self.checked.add((local, epoch))
                if fresh:
                    continue
            listed = {key: (size, etag) for key, size, etag in store.list(prefix)}
            store.notices.clear()  # (said when the folder was mirrored)
            manifest = _manifest(local)
            for r in files:
                rel = os.path.relpath(r.path, local).replace(os.sep, "/")
                for name, key, want in ((rel, r.key, (r.size, r.etag)),
                                        (rel[:-4] + ".idx", r.key[:-4] + ".idx", None)):
                    if want is None:
                        known = manifest.get(name)
                        if known is None:
                            continue
                        want = (known["size"], known["etag"])
                    got = listed.get(key)
                    if got != want:
                        with self.lock:
                            self.checked.discard((local, epoch))
                        how = "removed from the store" if got is None else \
                            f"replaced in the store (size {want[0]:,} -> {got[0]:,}, ETag {want[1]} -> {got[1]})"
                        raise DataChangedError(store.url(key), f"{how} since the job opened it: the next epoch would "
                                                               f"mix two versions of the data, even where its bytes "
                                                               f"are cached. Restart from the last saved state")


def _manifest(local: str) -> dict:
    """What shadow folder ``local`` was last mirrored from: ``{name: {"size", "etag"}}`` ({} when none)."""
    try:
        with open(os.path.join(local, ".manifest.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


async def _all_whole(fetcher, store, wanted: list) -> None:
    """Small objects fetched whole, many in flight at once (the first failure raised)."""
    import asyncio  # the fetcher's event loop only (asyncio costs ~30 ms at import)

    async def one(key, etag, size, path):
        data = await fetcher.network.bounded(store.get_async(key, etag=etag or None, size=size))
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.partial"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise fetcher.disk_error(e, path) from None

    await asyncio.gather(*[one(*w) for w in wanted])
