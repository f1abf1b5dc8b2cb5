"""Two simulated nodes (``ray.cluster_utils.Cluster``, one CPU each): the replicas land on
different nodes, weights cross nodes through the object store, a replica killed on one node
comes back at the current version."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from provrl.distributed.config import RayConfig  # noqa: E402
from provrl.distributed.engine import RayEngine, _env  # noqa: E402
from provrl.engine import EngineConfig  # noqa: E402
from provrl.provenance import SamplingParams  # noqa: E402

NODE = {"num_cpus": 1, "object_store_memory": 128 * 2**20}


@pytest.fixture(scope="module")
def cluster():
    with _env("RAY_worker_niceness", "0"):
        c = Cluster(initialize_head=True, head_node_args=NODE)
        c.add_node(**NODE)
        c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.mark.slow
def test_replicas_on_two_nodes_share_one_published_version_and_survive_a_kill(cluster, tiny):
    cfg = RayConfig(address=cluster.address, replicas=2, placement="spread")
    eng = RayEngine(tiny, EngineConfig(max_seqs=8, max_context=256, eos_stops=False), cfg)
    try:
        nodes = [i["node_id"] for i in eng.replica_info()]
        assert len(set(nodes)) == 2  # one replica per node
        p = SamplingParams(temperature=1.0, max_new_tokens=16, seed=0)
        sd = {k: v + 0.01 for k, v in tiny.model.state_dict().items() if k != "lm_head.weight"}
        eng.load_weights(sd, 1, "keep", schedule="all")
        assert eng.versions() == [1, 1] and eng.stats()["published_versions"] == 1
        futs = [eng.submit([5 + i, 6, 7], p) for i in range(4)]  # at once: spread by load
        outs = [f.result(timeout=300) for f in futs]
        assert {o.replica for o in outs} == {0, 1} and all((o.version == 1).all() for o in outs)
        eng.kill_replica(1)
        deadline = time.perf_counter() + 600
        while eng.clients[1].incarnation == 0:
            assert time.perf_counter() < deadline
            time.sleep(0.05)
        assert eng.clients[1].wait_ready(600)
        assert eng.versions() == [1, 1] and eng.replica_info()[1]["version"] == 1
        assert eng.replica_info()[1]["node_id"] == nodes[1]  # its node's CPU was the free one
        out = eng.submit([9, 9, 9], p).result(timeout=300)
        assert (out.version == 1).all()
    finally:
        eng.close()
