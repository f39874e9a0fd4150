"""The Ray executor: a sweep's work items as Ray tasks on a cluster (or on a Ray started on this machine).

- Builds, validations and reports are tasks of one CPU each.
- A benchmark is a task pinned to one node that takes that node's exclusive resource (``node:<ip>``, which Ray
  gives every node with capacity 1) and all of its CPUs (and GPUs), so no other task, benchmark or transform,
  runs on that node while it measures.
- Targets are matched to nodes: ``ort:cuda``/``ort:tensorrt`` need a node with a GPU (Ray's ``GPU``
  resource); ``openvino:gpu``/``openvino:npu`` need a node started with a custom resource of the target's name
  (``ray start --resources '{"openvino:gpu": 1}'``).  A recipe's evaluation is split into one item per group of
  targets with the same need.  When no node of the cluster has what a target needs, its group goes to any node,
  where the target is reported ``unavailable``, never measured elsewhere.

Every node must see the sweep's output and cache folders at the same path (a shared filesystem) and have
qdeploy installed in the same version.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, TypedDict

from qdeploy.core.errors import QdeployError, QdeployInputError
from qdeploy.pipeline.sweep.report_model import ExecutorDescription
from qdeploy.pipeline.sweep.work import WorkItem, WorkReply, execute

__all__ = ["LOCAL_OBJECT_STORE_BYTES", "RayExecutor", "RayNode", "benchmark_node", "cluster_need", "group_targets",
           "target_need"]

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 256 << 20
"""Object store of a Ray started here: work items pass plans and result rows, never models."""
_GPU_TARGETS = frozenset({"ort:cuda", "ort:tensorrt"})
_CUSTOM_TARGETS = frozenset({"openvino:gpu", "openvino:npu"})


class RayNode(TypedDict):
    """A live node of the cluster: its id, ip, CPUs, GPUs and the target needs it meets."""

    id: str
    ip: str
    cpus: int
    gpus: int
    needs: set[str]


def target_need(target: str) -> str | None:
    """The Ray resource a node must have to run a target; None for targets every CPU node has."""
    if target in _GPU_TARGETS:
        return "GPU"
    if target in _CUSTOM_TARGETS:
        return target
    return None


def cluster_need(target: str, nodes: list[RayNode]) -> str | None:
    """What a target needs of a node of this cluster; None when no node has it (any node then says unavailable)."""
    need = target_need(target)
    return need if need is not None and any(need in node["needs"] for node in nodes) else None


def group_targets(targets: list[str], nodes: list[RayNode]) -> list[tuple[str, ...]]:
    """A recipe's targets split by what they need of a node, in the recipe's order."""
    groups: dict[str | None, list[str]] = {}
    for target in targets:
        groups.setdefault(cluster_need(target, nodes), []).append(target)
    return [tuple(group) for group in groups.values()]


def benchmark_node(need: str | None, nodes: list[RayNode], busy: set[str]) -> RayNode | None:
    """A node with CPUs, what the targets need, and no benchmark of its own already; None when all are taken."""
    return next((node for node in nodes if node["id"] not in busy and node["cpus"] > 0
                 and (need is None or need in node["needs"])), None)


def _ray_execute(item: WorkItem, payload: tuple[Any, ...]) -> WorkReply:
    """The body of every task: run the item and say on which node it ran."""
    import ray

    node = f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:12]}"
    return execute(item, payload, None, node=node)


class RayExecutor:
    """Work items as Ray tasks; see the module's docstring for how benchmarks get a node alone."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise QdeployInputError("--executor ray needs Ray: pip install 'qdeploy[ray]'") from None
        self._ray = ray
        self._started_here = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:  # a Ray of this machine only, for trying the executor out or for tests
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                         object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                         _system_config={"idle_worker_killing_time_threshold_ms": 600_000})
            self._started_here = True
        self.address = address
        self.nodes = _alive_nodes(ray.nodes())
        if not any(node["cpus"] for node in self.nodes):
            raise QdeployError(f"the Ray cluster at {address or 'this machine'} has no node with CPUs to run on")
        self._task = ray.remote(max_retries=0)(_ray_execute)
        self._refs: dict[Any, tuple[WorkItem, str | None]] = {}
        self._warned: set[str] = set()
        self._benchmarked_on: dict[str, str] = {}
        """Node id of each recipe's last benchmark."""

    def describe(self) -> ExecutorDescription:
        return {"kind": "ray", "address": self.address or "started here",
                "nodes": [{"node": node["id"][:12], "ip": node["ip"], "cpus": node["cpus"], "gpus": node["gpus"],
                           "targets": sorted(node["needs"])} for node in self.nodes]}

    def target_groups(self, targets: list[str]) -> list[tuple[str, ...] | None]:
        for target in targets:
            self._need(target)  # warns once about a target no node has
        return list(group_targets(targets, self.nodes))

    def can_submit(self, item: WorkItem, running: list[WorkItem]) -> bool:
        busy = self._benchmark_nodes()
        if item.kind == "benchmark":
            return self._free_node(item, busy) is not None
        # while benchmarks wait for every node, new small tasks would only delay them: hold those back
        shared = sum(other.kind != "benchmark" for other in running)
        return shared < sum(node["cpus"] for node in self.nodes if node["id"] not in busy)

    def submit(self, item: WorkItem, payload: tuple[Any, ...]) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        need = self._group_need(item)
        if item.kind == "benchmark":
            node = self._free_node(item, self._benchmark_nodes())
            assert node is not None
            options: dict[str, Any] = {
                "num_cpus": node["cpus"], "num_gpus": node["gpus"] if need == "GPU" else 0,
                "resources": {f"node:{node['ip']}": 1.0, **({need: 1} if need and need != "GPU" else {})},
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node["id"], soft=False)}
            self._refs[self._task.options(**options).remote(item, payload)] = (item, node["id"])
            return
        options = {"num_cpus": 1, "num_gpus": 1 if need == "GPU" else 0,
                   "resources": {need: 1} if need and need != "GPU" else {}}
        if item.kind == "report" and item.recipe in self._benchmarked_on:
            # the report records the machine it is written on: let that be the one that measured
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self._benchmarked_on[item.recipe],
                                                                            soft=True)
        self._refs[self._task.options(**options).remote(item, payload)] = (item, None)

    def wait(self) -> list[tuple[WorkItem, WorkReply | BaseException]]:
        ray = self._ray
        ready, _ = ray.wait(list(self._refs), num_returns=1)
        others = [ref for ref in self._refs if ref not in ready]
        more = ray.wait(others, num_returns=len(others), timeout=0)[0] if others else []
        replies: list[tuple[WorkItem, WorkReply | BaseException]] = []
        for ref in [*ready, *more]:
            item, node = self._refs.pop(ref)
            if node is not None:
                self._benchmarked_on[item.recipe] = node
            try:
                replies.append((item, ray.get(ref)))
            except ray.exceptions.RayError as exc:  # the worker or its node died
                replies.append((item, exc))
        return replies

    def close(self) -> None:
        if self._started_here and self._ray.is_initialized():
            self._ray.shutdown()

    def _need(self, target: str) -> str | None:
        need = cluster_need(target, self.nodes)
        if need is None and target_need(target) is not None and target not in self._warned:
            self._warned.add(target)
            log.warning("no node of the Ray cluster has %s; %s will be reported unavailable", target_need(target),
                        target)
        return need

    def _group_need(self, item: WorkItem) -> str | None:
        return self._need(item.targets[0]) if item.targets else None

    def _benchmark_nodes(self) -> set[str]:
        return {node for item, node in self._refs.values() if item.kind == "benchmark" and node}

    def _free_node(self, item: WorkItem, busy: set[str]) -> RayNode | None:
        return benchmark_node(self._group_need(item), self.nodes, busy)


def _alive_nodes(nodes: list[dict[str, Any]]) -> list[RayNode]:
    """The cluster's live nodes: id, ip, CPUs, GPUs and the target needs they meet."""
    alive: list[RayNode] = []
    for node in nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        needs = {name for name in ("GPU", *_CUSTOM_TARGETS) if resources.get(name, 0) >= 1}
        alive.append({"id": node["NodeID"], "ip": node["NodeManagerAddress"], "cpus": int(resources.get("CPU", 0)),
                      "gpus": int(resources.get("GPU", 0)), "needs": needs})
    return alive
