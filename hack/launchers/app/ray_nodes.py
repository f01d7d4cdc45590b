"""The Ray job's driver: connects to the cluster at argv[1] (host:port of the head's GCS) and
checks that argv[2] nodes are alive and that a one-CPU task runs (on a worker: the head has no
CPUs); exits non-zero otherwise."""

import logging
import sys
from typing import Any

import ray

address, expected = sys.argv[1], int(sys.argv[2])
ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
alive = sorted(str(n["NodeManagerAddress"]) for n in nodes if n["Alive"])


@ray.remote(num_cpus=1)
def where() -> str:
    """The address of the node the task ran on."""
    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


ran_on = ray.get(where.remote())
print(f"ray nodes alive: {len(alive)}/{expected} {','.join(alive)}; a task ran on {ran_on}", flush=True)
sys.exit(0 if len(alive) == expected else 1)
