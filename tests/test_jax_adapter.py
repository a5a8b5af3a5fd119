"""loader.adapters.jax on 8 fake CPU devices (in a subprocess: XLA_FLAGS must be set before jax starts)."""

import json
import os
import subprocess
import sys

import pytest

from synthetic import make_data_bin

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import jax
from jax.sharding import Mesh
import loader
from loader.adapters import jax as jax_adapter
from synthetic import config_for

assert len(jax.devices()) == 8, jax.devices()
cfg = config_for(sys.argv[2], batching__num_shapes=3)
report = {}
for name, shape, axes in (("data8", (8,), ("data",)), ("data4_model2", (4, 2), ("data",))):
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data",) if len(shape) == 1 else ("data", "model"))
    reference = loader.build_train_iterator(cfg, split="rows")  # the numpy global batches
    batches = jax_adapter.global_batches(cfg, mesh, data_axes=axes, prefetch=2)
    n = checked = 0
    for want, got in zip(reference, batches):
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
reference = loader.build_train_iterator(dyn, split="rows")
n = odd = 0
for want, got in zip(reference, jax_adapter.global_batches(dyn, mesh, prefetch=2)):
    rows = got["net_input"]["src_tokens"].shape[0]
    real = int((want["weight"] > 0).sum())
    assert rows % 8 == 0 and rows >= real
    odd += want["net_input"]["src_tokens"].shape[0] % 8 != 0
    w = np.asarray(got["weight"])
    assert int((w > 0).sum()) == real and (w[len(want["weight"]):] == 0).all()
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
    assert report["dynamic"]["batches"] > 10 and report["dynamic"]["not_multiple_of_8_in_process"] > 0


def test_core_does_not_import_jax():
    code = "import sys, loader, loader.adapters; print('jax' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


MULTI = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=sys.argv[3], num_processes=2, process_id=int(sys.argv[4]))
import jax.numpy as jnp
from jax.sharding import Mesh
import loader
from loader.adapters import jax as jax_adapter
from synthetic import config_for

cfg = config_for(sys.argv[2], batching__num_shapes=3)
assert jax.process_count() == 2 and len(jax.devices()) == 8 and len(jax.local_devices()) == 4
mesh = Mesh(np.array(jax.devices()), ("data",))
reference = loader.build_train_iterator(cfg, split="rows")  # the whole global batch, for checking
total = jax.jit(lambda x: jnp.sum(x))
fed_rows = checked = batches = 0
for want, got in zip(reference, jax_adapter.global_batches(cfg, mesh)):
    src = got["net_input"]["src_tokens"]
    whole = want["net_input"]["src_tokens"]
    assert src.shape == whole.shape  # a global array, though this process fed only its rows
    assert int(total(src)) == int(whole.sum())  # a cross-process reduction sees the whole batch
    for shard in src.addressable_shards:
        d = shard.index[0].start or 0
        assert np.array_equal(np.asarray(shard.data), whole[d:d + shard.data.shape[0]])
        checked += 1
    fed_rows += whole.shape[0] // 2
    batches += 1
print(json.dumps({"process": jax.process_index(), "batches": batches, "checked": checked}))
jax.distributed.shutdown()
"""


def test_two_processes_assemble_the_same_global_batch(root):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, "-c", MULTI, HERE, str(root), f"127.0.0.1:{port}", str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=240)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(o["process"] for o in outs) == [0, 1]
    assert outs[0]["batches"] == outs[1]["batches"] > 10
    assert all(o["checked"] == 4 * o["batches"] for o in outs)  # each process holds 4 of the 8 shards
