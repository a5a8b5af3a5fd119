"""babelfeed.adapters.jax on 8 fake CPU devices (in a subprocess: XLA_FLAGS must be set before jax starts)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from s3server import s3, s3_env  # noqa: F401  (fixtures)
from synthetic import make_data_bin

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helpers are

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import jax
from jax.sharding import Mesh
import babelfeed
from babelfeed.adapters import jax as jax_adapter
from synthetic import config_for

assert len(jax.devices()) == 8, jax.devices()
cfg = config_for(sys.argv[2], batching__num_shapes=3)
report = {}
for name, shape, axes in (("data8", (8,), ("data",)), ("data4_model2", (4, 2), ("data",))):
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data",) if len(shape) == 1 else ("data", "model"))
    reference = babelfeed.build_train_iterator(cfg, split="rows")  # the numpy global batches
    batches = jax_adapter.global_batches(cfg, mesh, data_axes=axes, prefetch=2)
    n = checked = 0
    for want, got in zip(reference, batches, strict=True):
        src = got["net_input"]["src_tokens"]
        assert isinstance(src, jax.Array) and src.shape == want["net_input"]["src_tokens"].shape
        assert np.array_equal(np.asarray(src), want["net_input"]["src_tokens"])
        rows = src.shape[0]
        per = rows // shape[0]
        for shard in src.addressable_shards:  # each device holds exactly its rows
            d = shard.index[0].start or 0
            assert shard.data.shape[0] == per and d % per == 0
            assert np.array_equal(np.asarray(shard.data), want["net_input"]["src_tokens"][d:d + per])
            checked += 1
        assert np.array_equal(np.asarray(got["weight"]), want["weight"])
        assert got["ntokens"] == want["ntokens"]
        n += 1
    report[name] = {"batches": n, "shards_checked": checked}
# dynamic batches (any row count) on 8 data devices: masked rows fill each global batch up to a multiple of 8
dyn = config_for(sys.argv[2])
mesh = Mesh(np.array(jax.devices()), ("data",))
reference = babelfeed.build_train_iterator(dyn, split="rows")
n = odd = 0
for want, got in zip(reference, jax_adapter.global_batches(dyn, mesh, prefetch=2), strict=True):
    rows = got["net_input"]["src_tokens"].shape[0]
    real = int((want["weight"] > 0).sum())
    assert rows % 8 == 0 and rows >= real
    odd += want["net_input"]["src_tokens"].shape[0] % 8 != 0
    w = np.asarray(got["weight"])
    assert int((w > 0).sum()) == real  # (where the masked rows go is the adapter's: fewer rows than devices spread out)
    assert np.array_equal(np.asarray(got["target"])[w > 0], want["target"][want["weight"] > 0])
    n += 1
report["dynamic"] = {"batches": n, "not_multiple_of_8_in_process": int(odd)}
# exact resume through the prefetcher: its state is the position after the batches handed out
mesh = Mesh(np.array(jax.devices()), ("data",))
a = jax_adapter.global_batches(cfg, mesh, prefetch=3)
head = [np.asarray(next(a)["net_input"]["src_tokens"]) for _ in range(4)]
state = a.get_state()
rest_a = [np.asarray(b["net_input"]["src_tokens"]) for b in a]
b = jax_adapter.global_batches(cfg, mesh, prefetch=1)
b.set_state(state)
rest_b = [np.asarray(x["net_input"]["src_tokens"]) for x in b]
report["resume"] = len(rest_a) == len(rest_b) and all(np.array_equal(x, y) for x, y in zip(rest_a, rest_b))
# a mixture edit: resumed from a state with the edited config, and made in place at the same step, the same batches
edited = config_for(sys.argv[2], batching__num_shapes=3, data__directions="aaa-bbb,aaa-ddd", mixing__temperature=2.0)
c = jax_adapter.global_batches(edited, mesh, prefetch=2)
c.set_state(state, mixture_change="allow")
rest_c = [np.asarray(x["net_input"]["src_tokens"]) for x in c]
d = jax_adapter.global_batches(cfg, mesh, prefetch=2)
for _ in range(4):
    next(d)
report["edit_step"] = d.edit(**{"data.directions": "aaa-bbb,aaa-ddd", "mixing.temperature": 2.0}).step
rest_d = [np.asarray(x["net_input"]["src_tokens"]) for x in d]
report["edit"] = len(rest_c) == len(rest_d) > 0 and all(np.array_equal(x, y) for x, y in zip(rest_c, rest_d))
report["edit_differs"] = len(rest_c) != len(rest_a) or any(not np.array_equal(x, y) for x, y in zip(rest_a, rest_c))
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("jaxbin")
    make_data_bin(r)
    return r


def test_sharded_global_batches_on_8_devices(root):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", CHILD, HERE, str(root)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["data8"]["batches"] > 10 and report["data8"]["shards_checked"] == 8 * report["data8"]["batches"]
    assert report["data4_model2"]["shards_checked"] == 8 * report["data4_model2"]["batches"]  # replicated on model
    assert report["resume"] is True
    assert report["edit"] is True and report["edit_differs"] is True and report["edit_step"] == 5
    assert report["dynamic"]["batches"] > 10 and report["dynamic"]["not_multiple_of_8_in_process"] > 0


def test_core_does_not_import_jax():
    code = "import sys, babelfeed, babelfeed.adapters; print('jax' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


MESHES = r"""
import os, pickle, sys
sys.path.insert(0, sys.argv[1])
root, out_path, mode = sys.argv[2], sys.argv[3], sys.argv[4]
import numpy as np
import jax
if mode == "multi":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=sys.argv[5], num_processes=2, process_id=int(sys.argv[6]))
from jax.sharding import Mesh
import babelfeed
from babelfeed.adapters import jax as jax_adapter
from synthetic import config_for

assert len(jax.devices()) == 8
tpu = babelfeed.load_config(os.path.join(sys.argv[1], "..", "configs", "tpu_static.py"))
tpu.data.path, tpu.batching.max_tokens, tpu.batching.window = root, 512, 0  # static batches below 8 rows
configs = {"static": config_for(root, batching__num_shapes=3), "dynamic": config_for(root), "tpu": tpu}
p0 = [d for d in jax.devices() if d.process_index == 0]
p1 = [d for d in jax.devices() if d.process_index == 1] or p0[4:]
p0 = p0[:4]
orders = {"natural": p0 + p1, "p1_first": p1 + p0, "interleaved": [d for pair in zip(p1, p0) for d in pair]}
# name: config, device order, mesh shape, axis names, data axes
CASES = {
    "static_data8": ("static", "natural", (8,), ("data",), None),
    "dynamic_p1first_data8": ("dynamic", "p1_first", (8,), ("data",), ("data",)),
    "dynamic_p1first_data4_model2": ("dynamic", "p1_first", (4, 2), ("data", "model"), ("data",)),
    "dynamic_p1first_data2_model4": ("dynamic", "p1_first", (2, 4), ("data", "model"), ("data",)),
    "dynamic_interleaved_model2_data4": ("dynamic", "interleaved", (2, 4), ("model", "data"), ("data",)),
    "tpu_p1first_axes_ab": ("tpu", "p1_first", (2, 2, 2), ("a", "b", "m"), ("a", "b")),
    "tpu_replicated_model2_data4": ("tpu", "p1_first", (2, 4), ("model", "data"), ("data",)),
}
if os.environ.get("MESH_CASES"):
    CASES = {k: CASES[k] for k in os.environ["MESH_CASES"].split(",")}
fed = []
convert = jax_adapter.to_global


def recording(batch, *args):
    fed.append(np.array(batch["id"]))  # the rows this process gathered and fed
    return convert(batch, *args)


jax_adapter.to_global = recording


def leaves(batch, prefix=""):
    for k, v in batch.items():
        if isinstance(v, dict):
            yield from leaves(v, prefix + k + ".")
        else:
            yield prefix + k, v


report = {}
for name, (cfg, order, shape, axis_names, data_axes) in CASES.items():
    devices = orders[order] if mode == "multi" else jax.devices()
    mesh = Mesh(np.array(devices).reshape(shape), axis_names)
    fed.clear()
    batches = []
    it = jax_adapter.global_batches(configs[cfg], mesh, data_axes=data_axes, prefetch=2)
    for batch in it:
        out = {}
        for key, v in leaves(batch):
            if isinstance(v, jax.Array):
                assert v.shape[0] % int(np.prod([mesh.shape[a] for a in data_axes or ("data",)])) == 0
                shards = {}
                for sh in v.addressable_shards:  # what this process's devices hold, by global row slice
                    shards[(sh.index[0].start or 0, sh.index[0].stop or v.shape[0])] = np.asarray(sh.data)
                out[key] = (v.shape, shards)
            else:
                out[key] = v
        batches.append(out)
    it.close()  # the prefetcher has started reading the next epoch ahead
    report[name] = {"batches": batches, "fed": fed[:len(batches)]}
with open(out_path, "wb") as f:
    pickle.dump(report, f)
if mode == "multi":
    jax.distributed.shutdown()
"""


def _assemble(pieces, shape, dtype):
    """A global array from (row slice -> rows) pieces; every row covered once (replicas must agree)."""
    out = np.zeros(shape, dtype)
    seen = np.zeros(shape[0], bool)
    for (a, b), rows in pieces:
        if seen[a:b].any():
            assert seen[a:b].all() and np.array_equal(out[a:b], rows)  # a replica holds the same rows
        out[a:b], seen[a:b] = rows, True
    assert seen.all()
    return out


def test_two_processes_assemble_the_single_process_batches(root, tmp_path):
    """2 processes x 4 devices against 1 process x 8 devices, for static and dynamic batches (row counts that 8
    does not divide; static batches of configs/tpu_static.py below 8 rows), meshes 1-D, 2-D and 3-D, data axes of
    2/4/8 devices (a tuple too), device orders with process 1's devices first or interleaved (non-contiguous row
    blocks), a data axis replicated across the processes: every array leaf of every batch is bit-identical to the
    single-process run, and each process fed exactly the rows its devices hold, in global row order."""
    _two_processes(root, root, tmp_path)


def _two_processes(root, data, tmp_path, caches=None, cases=None):
    """The single-process run on ``root`` against two processes on ``data`` (the same data, maybe in a store;
    ``caches``: each process's own cache folder, as two hosts)."""
    import pickle
    import socket

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    if cases:
        env["MESH_CASES"] = cases
    single = subprocess.run([sys.executable, "-c", MESHES, HERE, str(root), str(tmp_path / "single.pkl"), "single"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    procs = [subprocess.Popen([sys.executable, "-c", MESHES, HERE, str(data), str(tmp_path / f"p{i}.pkl"), "multi",
                               f"127.0.0.1:{port}", str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(env, **({"BABELFEED_CACHE_DIR": str(caches[i])} if caches else {})))
             for i in range(2)]
    for p in procs:
        try:
            _, err = p.communicate(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, err[-3000:]
    want = pickle.loads((tmp_path / "single.pkl").read_bytes())
    got = [pickle.loads((tmp_path / f"p{i}.pkl").read_bytes()) for i in range(2)]
    assert set(want) == set(got[0]) == set(got[1])
    odd = 0
    for case in want:
        ref = want[case]["batches"]
        assert len(ref) > 10
        for g in got:  # no zip() truncation: the same number of batches in every run
            assert len(g[case]["batches"]) == len(ref) and len(g[case]["fed"]) == len(ref), case
        for b, whole in enumerate(ref):
            parts = [g[case]["batches"][b] for g in got]
            assert all(set(p) == set(whole) for p in parts), case
            for key, value in whole.items():
                if not isinstance(value, tuple):  # host-local values (ntokens): per process by design
                    continue
                shape, shards = value
                full = _assemble(shards.items(), shape, next(iter(shards.values())).dtype)
                assert all(p[key][0] == shape for p in parts), (case, b, key)
                pieces = [item for p in parts for item in p[key][1].items()]
                got_full = _assemble(pieces, shape, full.dtype)
                assert got_full.dtype == full.dtype and np.array_equal(got_full, full), (case, b, key)
            ids = _assemble(whole["id"][1].items(), whole["id"][0], np.int64)
            odd += len(ids) % 8 != 0
            for g, p in zip(got, parts):  # each process fed exactly its devices' rows, in global row order
                held = sorted(p["id"][1])
                rows = np.concatenate([np.arange(a, z) for a, z in held])
                assert np.array_equal(g[case]["fed"][b], ids[rows]), (case, b)
                # each holds half the rows; with the data axis inside "model", both hold (and feed) all of them
                assert len(rows) * (1 if "replicated" in case else 2) == len(ids), case
    assert odd > 0  # some batches' row counts are no multiple of 8 (they are of the data devices)


def test_two_processes_read_the_batches_from_a_store_each_fetching_its_own_rows(root, tmp_path, s3_env):
    """The same on data in an S3 store, each process with a cache and fetcher of its own (as two hosts): every
    leaf equals the single-process run on the local copy."""
    from s3server import stop_fetcher

    url = s3_env.upload(str(root), "bkt", "jax/data_bin")
    caches = [tmp_path / "host0", tmp_path / "host1"]
    try:
        _two_processes(root, url, tmp_path, caches, cases="dynamic_p1first_data4_model2,static_data8")
    finally:
        for c in caches:
            stop_fetcher(str(c))


def test_a_data_axis_named_by_a_string_is_one_axis():
    """data_axes="data" was read as the axes 'd', 'a', 't', 'a' and refused as not of the mesh."""
    code = ("import numpy as np, jax\nfrom jax.sharding import Mesh, PartitionSpec\n"
            "from babelfeed.adapters import jax as bf\n"
            "mesh = Mesh(np.array(jax.devices()[:1]), ('data',))\n"
            "assert bf.data_sharding(mesh, 'data').spec == bf.data_sharding(mesh, ('data',)).spec\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
