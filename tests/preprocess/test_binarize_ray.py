"""binarize on Ray: a local Ray instance of 2 CPUs started once for this module. The same bytes as the local
engine; a worker killed mid-chunk is run again by Ray and leaves nothing partial; a killed driver resumes."""

import os
import signal
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray", reason="the test extra installs ray; without it the Ray engine cannot be tested")

import babelfeed  # noqa: E402
from babelfeed.preprocess.binarize import binarize  # noqa: E402

from test_binarize import make_raw, opts, quiet, read_all  # noqa: E402
from test_binarize_inputs import spread  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    import logging

    ray.init(num_cpus=2, object_store_memory=128 << 20, include_dashboard=False, logging_level=logging.WARNING)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def test_ray_writes_the_bytes_of_the_local_engine(cluster, tmp_path):
    import numpy as np

    raw = tmp_path / "raw"
    make_raw(raw, n=2000, seed=4)
    many = tmp_path / "many"
    specs = spread(raw, many, np.random.default_rng(3))
    local = tmp_path / "local"
    binarize(opts(many, local, shards=3, chunk_lines=50, workers=2, inputs=tuple(specs)), log=quiet)
    out = tmp_path / "ray"
    report = binarize(opts(many, out, shards=3, chunk_lines=50, inputs=tuple(specs), engine="ray"), log=quiet)
    assert report["engine"] == "ray" and report["workers"] == 2
    assert read_all(out) == read_all(local) and len(read_all(out)) > 6


def test_a_ray_worker_killed_mid_chunk_is_run_again(cluster, tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    make_raw(raw, n=3000, seed=5)
    clean = tmp_path / "clean"
    binarize(opts(raw, clean, shards=3, chunk_lines=100, workers=1), log=quiet)
    marker = tmp_path / "died"
    monkeypatch.setenv("_BABELFEED_TEST_FAIL", f"encode:train.en-de.shard001.chunk3={marker}")
    out = tmp_path / "out"
    binarize(opts(raw, out, shards=3, chunk_lines=100, engine="ray", spm_model=str(clean / "spm.model"),
                  train_spm=None), log=quiet)
    assert marker.exists()  # the worker died after writing part of its chunk
    assert read_all(out) == read_all(clean)
    assert not [n for d, _, ns in os.walk(out) for n in ns if n.endswith(".partial")]
    # and one killed while merging a shard
    marker2 = tmp_path / "died2"
    monkeypatch.setenv("_BABELFEED_TEST_FAIL", f"merge:train.en-de.shard002={marker2}")
    out2 = tmp_path / "out2"
    binarize(opts(raw, out2, shards=3, chunk_lines=100, engine="ray", spm_model=str(clean / "spm.model"),
                  train_spm=None), log=quiet)
    assert marker2.exists()
    assert read_all(out2) == read_all(clean)
    assert not [n for d, _, ns in os.walk(out2) for n in ns if n.endswith(".partial")]


def test_a_killed_ray_driver_resumes_with_the_same_bytes(cluster, tmp_path):
    raw = tmp_path / "raw"
    make_raw(raw, n=8000, seed=3)
    clean = tmp_path / "clean"
    binarize(opts(raw, clean, shards=8, chunk_lines=50, workers=1), log=quiet)
    out = tmp_path / "out"
    cmd = [os.path.join(os.path.dirname(sys.executable), "babelfeed"), "binarize", str(raw), "-o", str(out),
           "--spm", str(clean / "spm.model"), "--shards", "8", "--chunk-lines", "50", "--max-len", "200",
           "--engine", "ray", "--ray-address", cluster, "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = out / ".binarize"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if records.exists() and any(n.endswith(".json") and "shard" in n for n in os.listdir(records)):
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be killed; give it more work"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = [n for n in os.listdir(records) if n.endswith(".json") and "shard" in n]
    assert 1 <= len(done) < 10
    for f in babelfeed.ShardedCorpus(out, check=False).files:  # what is there is complete
        babelfeed.IndexedDataset(f.prefix)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "already finalized" in result.stderr
    assert read_all(out) == read_all(clean)
    assert not [n for d, _, ns in os.walk(out) for n in ns if n.endswith(".partial")]


def test_ray_writes_the_documents_of_the_local_engine(cluster, tmp_path):
    import numpy as np
    from test_documents import make_docs, opts as doc_opts

    make_docs(tmp_path / "raw", np.random.default_rng(4))
    local = tmp_path / "local"
    binarize(doc_opts(tmp_path / "raw", local, shards=2, workers=2, split_sentences=True), log=quiet)
    out = tmp_path / "ray"
    binarize(doc_opts(tmp_path / "raw", out, shards=2, engine="ray", split_sentences=True), log=quiet)
    assert read_all(out) == read_all(local) and len(read_all(out)) == 9


def test_a_tasks_own_error_stops_a_ray_job_with_that_error(cluster, tmp_path):
    from babelfeed.errors import BinarizeError
    from test_documents import opts as doc_opts

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.jsonl").write_text('{"text": "the cat sat"}\n{not json\n')
    with pytest.raises(BinarizeError, match=r"a\.jsonl: line 2 is not JSON"):
        binarize(doc_opts(raw, tmp_path / "o", train_spm=30, engine="ray"), log=quiet)
