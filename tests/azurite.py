"""Azure's own storage emulator (Azurite, from npm) on the loopback for tests of ``az://`` folders, and helpers to
upload a local folder to it. The fixture installs Azurite on first use into the user's cache folder
(``~/.cache/babelfeed-tests/``, ~30 s, once: ``npm_tools.py``), starts it bound to 127.0.0.1 only, keeping blobs
in memory, and stops it after. Without node and npm the tests that need it are skipped, and the run's summary says so in capitals
(conftest.py): ``az://`` is then untested on this machine. ``BABELFEED_AZURITE`` names an installed
``azurite-blob`` instead."""

import os

import pytest

from npm_tools import Unavailable, npm_program
from s3server import free_port, on_fresh_fetcher, start_server, stop_server

VERSION = "3.37.0"
# Azurite's well-known development account (published in Azure's docs; it opens nothing but a local emulator)
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
UNTESTED = "AZ:// UNTESTED"  # (the skip reason's mark, which conftest.py's summary looks for)


class AzuriteServer:
    def __init__(self, program: str, folder: str):
        self.port = free_port()
        self.proc = start_server([program, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                                  "--inMemoryPersistence", "--skipApiVersionCheck", "--silent"], self.port, "Azurite",
                                 cwd=folder)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    def env(self) -> dict:
        """What a user of the emulator sets (obstore reads it): the development account at this port."""
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT,
                "AZURE_STORAGE_ACCOUNT_KEY": KEY, "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{self.port}"}

    def container(self, name: str):
        from azure.storage.blob import BlobServiceClient  # (fork-safe, unlike an obstore client in the test)

        conn = f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={self.endpoint};"
        c = BlobServiceClient.from_connection_string(conn).get_container_client(name)
        if not c.exists():
            c.create_container()
        return c

    def put(self, container: str, key: str, body: bytes) -> None:
        self.container(container).upload_blob(key, body, overwrite=True)

    def upload(self, local: str, container: str, prefix: str) -> str:
        c = self.container(container)
        for folder, _, names in os.walk(local):
            for name in names:
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    c.upload_blob(f"{prefix}/{os.path.relpath(path, local)}".replace(os.sep, "/"), f.read(),
                                  overwrite=True)
        return f"az://{container}/{prefix}"

    def stop(self):
        stop_server(self.proc)


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    pytest.importorskip("obstore")
    pytest.importorskip("azure.storage.blob")
    try:
        program = npm_program("azurite", VERSION, "azurite-blob", override="BABELFEED_AZURITE")
    except Unavailable as e:
        pytest.skip(f"{UNTESTED}: Azure's emulator (Azurite) is not here: {e}")
    server = AzuriteServer(program, str(tmp_path_factory.mktemp("azurite")))
    yield server
    server.stop()


@pytest.fixture
def az_env(azurite, tmp_path, monkeypatch):
    """The emulator's environment and a cache folder of the test's own (so its own fetcher)."""
    yield from on_fresh_fetcher(azurite, tmp_path, monkeypatch)
