"""A real two-node Ray cluster on this machine, shared by the multi-node and recovery tests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported: nodes on 127.0.0.1

import pytest
import ray
from ray.cluster_utils import Cluster

from vlrl.runtime.cluster import apply_auth_settings

NODE = {"num_cpus": 1, "object_store_memory": 150 * 2**20}


@contextlib.contextmanager
def two_node_cluster() -> Iterator[Cluster]:
    """Head + one more node (1 CPU each), the driver connected; everything stopped on exit."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        apply_auth_settings()  # the same mode on every node and the driver
        if ray.is_initialized():
            ray.shutdown()
        cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        try:
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()
