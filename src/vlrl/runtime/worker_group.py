"""Workers on Ray: a placement group with one bundle per device, one actor per bundle.

`RayWorkerGroup` and the in-process `vlrl.training.worker.Worker` are both a `WorkerGroup`
(`vlrl.runtime.worker_api`), so `GRPOTrainer` runs the same loop on one worker or on a group
(`vlrl.training.worker.make_worker_group` picks by `runtime.backend`). The group is handed the
worker class it hosts (`worker_cls`): the runtime sits below training and never imports it.

    rollout   tasks split into contiguous chunks, one per worker (a task's G episodes stay on one
              worker), each worker sampling with a seed derived from the step's seed and its rank;
              episodes come back in task order
    update    `make_update_plans` (`vlrl.runtime.update_plan`) on the driver: the mini-batches one worker would use, a
    share of
              each for every worker; each worker gets only the episodes of its plan
    evaluate  tasks split like rollouts; results concatenated in task order
    state     adapter / optimizer state gathered from the FSDP shards, rank 0's copy returned;
              checkpoints: every worker writes (and reads back) its own optimizer shard (DCP)
              and returns its random states

Every call goes to all workers at once; the first failure is raised at once (a worker stuck in a
collective with a dead peer would otherwise wait for `runtime.collective_timeout_s`). Errors a
user can fix come back as one-line `VlrlError`s. A worker whose process died (killed, out of
memory, node lost) is a `WorkerDiedError`, also when a surviving peer reports it first (its
collective broke): the trainer then rebuilds the group and resumes from its last checkpoint.
`close()` (or leaving a `with` block, or the group being garbage-collected) kills the actors and
removes the placement group.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from pathlib import Path
from typing import Any

import torch

from vlrl.config import RunConfig
from vlrl.envs.base import Task
from vlrl.errors import VlrlError, WorkerDiedError
from vlrl.eval.evaluate import EvalResult
from vlrl.rollout.engine import SamplingParams
from vlrl.rollout.episodes import Episode, RolloutStats
from vlrl.rollout.factory import sampling_params
from vlrl.runtime.update_plan import UpdateStats, combine_update_stats, loss_units, make_update_plans, split_evenly

# Worker r samples with seed + r * RANK_SEED_STRIDE (rank 0 keeps the step's seed, so one worker
# on Ray samples exactly what the in-process worker samples).
RANK_SEED_STRIDE = 1_000_000_007


# How long a liveness check waits for each worker after a call failed.
LIVENESS_TIMEOUT_S = 30.0


def rank_seed(seed: int | None, rank: int) -> int | None:
    """The sampling seed of worker `rank` for a call seeded with `seed`."""
    return None if seed is None else (seed + rank * RANK_SEED_STRIDE) % 2**63


class WorkerActor:
    """What runs inside one Ray actor: a worker (`worker_cls`, e.g. `Worker`) on the device of its bundle."""

    def __init__(self) -> None:
        self.worker = None

    def node(self) -> tuple[str, str]:
        """(Ray node id, `hostname (ip)`) of the node this actor runs on."""
        import ray

        from vlrl.runtime.cluster import node_name

        return ray.get_runtime_context().get_node_id(), node_name()

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def pid(self) -> int:
        """The actor's process id (tests kill it to check recovery)."""
        return os.getpid()

    def free_port(self) -> int:
        from vlrl.runtime.distributed import free_port

        return free_port()

    def start(
        self,
        worker_cls: type,
        config: RunConfig,
        total_optimizer_steps: int,
        adapter_dir: str | None,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int | None,
    ) -> None:
        check_storage(config.storage.root, rank)
        self.worker = worker_cls(
            config,
            total_optimizer_steps,
            adapter_dir,
            rank=rank,
            world_size=world_size,
            master_addr=master_addr,
            master_port=master_port,
        )

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)

    def rollout(self, tasks: list[Task], group_size: int, params: SamplingParams) -> tuple[list[Episode], RolloutStats]:
        stats = RolloutStats()
        return self.worker.rollout(tasks, group_size, params, stats), stats


def check_storage(root: str, rank: int) -> None:
    """Fail with the node's name unless this worker can create and write files under `root`."""
    if "://" in root:  # an fsspec URL: checked by whoever writes there
        return
    from vlrl.runtime.cluster import node_name

    path = Path(root)
    probe = path / f".vlrl-write-check-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise VlrlError(
            f"storage root {root} is not writable from worker {rank} on node {node_name()} ({exc.strerror or exc}); "
            "mount the shared storage on every node or set storage.root"
        ) from None


def _absolute(path: str) -> str:
    return path if "://" in path else str(Path(path).expanduser().resolve())


class RayWorkerGroup:
    """`runtime.num_workers` worker actors in one placement group, driven like one worker.

    `worker_cls` is the class each actor hosts (`vlrl.training.worker.Worker`): constructed as
    `worker_cls(config, total_optimizer_steps, adapter_dir, rank=, world_size=, master_addr=, master_port=)`.
    """

    def __init__(
        self, config: RunConfig, total_optimizer_steps: int, init_adapter: str | None = None, *, worker_cls: type
    ):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from vlrl.models.loading import ensure_model, read_model_config
        from vlrl.runtime.cluster import cluster_address, connect

        rt = config.runtime
        self.world_size = rt.num_workers
        # Workers may run elsewhere (other nodes, other working directories): paths go absolute,
        # and a tiny model to build is built once, here, not by every worker at the same time.
        self.config = config.model_copy(deep=True)
        self.config.model.path = _absolute(config.model.path)
        self.config.storage.root = _absolute(config.storage.root)
        ensure_model(self.config.model)
        if cluster_address(rt) is None:  # a local instance shares this filesystem: check before starting Ray
            read_model_config(self.config.model.path)
        connect(rt)
        self.actors: list[Any] = []
        self._held: dict[str, Any] = {"actors": self.actors, "pg": None}
        self._release = weakref.finalize(self, _release, self._held)
        try:
            self.pg = self._held["pg"] = self._reserve()
            bundle_gpus = 1 if rt.use_gpu else 0
            actor_cls = ray.remote(WorkerActor)
            for rank in range(self.world_size):
                strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=rank)
                self.actors.append(
                    actor_cls.options(
                        num_cpus=rt.cpus_per_worker, num_gpus=bundle_gpus, scheduling_strategy=strategy
                    ).remote()
                )
            nodes = self._all("node", [a.node.remote() for a in self.actors])
            self.node_ids = [node_id for node_id, _ in nodes]  # per rank
            self.node_names = [name for _, name in nodes]
            master_addr = ray.get(self.actors[0].node_ip.remote())
            port = ray.get(self.actors[0].free_port.remote()) if self.world_size > 1 else None
            adapter = _absolute(init_adapter) if init_adapter else None
            self._all(
                "start",
                [
                    a.start.remote(
                        worker_cls,
                        self.config,
                        total_optimizer_steps,
                        adapter,
                        rank,
                        self.world_size,
                        master_addr,
                        port,
                    )
                    for rank, a in enumerate(self.actors)
                ],
            )
        except BaseException:
            self.close()
            raise

    # -- placement and calls -------------------------------------------------------------------
    def _reserve(self):
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        from vlrl.runtime.cluster import describe_resources

        rt = self.config.runtime
        bundle = {"CPU": float(rt.cpus_per_worker), **({"GPU": 1.0} if rt.use_gpu else {})}
        pg = placement_group([dict(bundle) for _ in range(self.world_size)], strategy=rt.placement_strategy)
        try:
            ray.get(pg.ready(), timeout=rt.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            asked = ", ".join(f"{k}={v:g}" for k, v in bundle.items())
            raise VlrlError(
                f"cannot place {self.world_size} worker(s) of {{{asked}}} ({rt.placement_strategy}) within "
                f"{rt.placement_timeout_s:g}s: the cluster has {describe_resources()}; lower runtime.num_workers or "
                f"runtime.cpus_per_worker, set runtime.use_gpu to match, or add nodes"
            ) from None
        return pg

    def _all(self, what: str, refs: list) -> list:
        """Results of calls on several workers, in order; the first failure is raised at once."""
        import ray

        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                ray.get(done)
            return ray.get(refs)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, VlrlError):
                raise VlrlError(str(cause)) from None
            dead = self._dead_ranks()  # a survivor's broken collective may arrive before the death
            if dead:
                raise WorkerDiedError(f"worker {dead[0]} died during {what}") from None
            raise
        except ray.exceptions.RayActorError as exc:
            first = (str(exc).strip().splitlines() or ["no reason given"])[0]
            dead = self._dead_ranks(timeout_s=5.0)
            rank = dead[0] if dead else "?"
            raise WorkerDiedError(f"worker {rank} died during {what} ({first[:200]})") from None

    def _dead_ranks(self, timeout_s: float = LIVENESS_TIMEOUT_S) -> list[int]:
        """Ranks whose actor is gone: a ping fails with an actor error. Returns at the first dead
        one found, or when every ping answered, or after `timeout_s` (a busy worker is alive)."""
        import time

        import ray

        pending = {actor.node_ip.remote(): rank for rank, actor in enumerate(self.actors)}
        deadline = time.monotonic() + timeout_s
        dead: list[int] = []
        while pending and not dead and time.monotonic() < deadline:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in done:
                rank = pending.pop(ref)
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    dead.append(rank)
        return sorted(dead)

    def _call(self, method: str, *args: Any) -> list:
        """`Worker.method(*args)` on every worker (ObjectRefs in args are shipped once)."""
        return self._all(method, [a.call.remote(method, *args) for a in self.actors])

    # -- the WorkerGroup interface (vlrl.runtime.worker_api) -------------------------------------
    def sampling_params(self, greedy: bool = False, seed: int | None = None) -> SamplingParams:
        return sampling_params(self.config, greedy, seed)

    def rollout(
        self, tasks: list[Task], group_size: int, params: SamplingParams, stats: RolloutStats | None = None
    ) -> list[Episode]:
        """Episodes of every task in task order, G per task, played on all workers at once.

        Merged stats: token and call counts add up; generate and env seconds are those of the
        slowest worker (they ran in parallel).
        """
        calls, offsets, start = [], [], 0
        for rank, chunk in enumerate(split_evenly(list(tasks), self.world_size)):
            if chunk:
                params_r = dataclasses.replace(params, seed=rank_seed(params.seed, rank))
                calls.append(self.actors[rank].rollout.remote(chunk, group_size, params_r))
                offsets.append(start)
            start += len(chunk)
        results = self._all("rollout", calls)
        episodes: list[Episode] = []
        for (eps, _), offset in zip(results, offsets):
            for e in eps:
                e.group += offset  # a task's index in this call, as one worker would number it
            episodes += eps
        if stats is not None and results:
            parts = [s for _, s in results]
            stats.generated_tokens += sum(s.generated_tokens for s in parts)
            stats.engine_calls += sum(s.engine_calls for s in parts)
            stats.generate_s += max(s.generate_s for s in parts)
            stats.env_s += max(s.env_s for s in parts)
        return episodes

    def evaluate(self, tasks: list[Task], greedy: bool, label: str) -> EvalResult:
        """One episode per task on all workers at once, merged into one `EvalResult` in task order."""
        seed = self.config.train.seed
        calls = [
            self.actors[rank].call.remote("evaluate", chunk, greedy, label, rank_seed(seed, rank))
            for rank, chunk in enumerate(split_evenly(list(tasks), self.world_size))
            if chunk
        ] or [self.actors[0].call.remote("evaluate", [], greedy, label, seed)]
        parts = self._all("evaluate", calls)
        first = parts[0]
        return EvalResult(
            first.label,
            first.split,
            first.decoding,
            [e for p in parts for e in p.episodes],
            [t for p in parts for t in p.traces],
        )

    def update(self, episodes: list[Episode], advantages: list[float], seed: int) -> UpdateStats:
        """One GRPO update, data-parallel, equal to one worker's on the same episodes (see update_plan.py).

        Each worker gets only the episodes of its plan: 1/W of them with ppo_epochs=1; with more
        epochs, the union of its shares over the epochs (up to all of them), which it also scores.
        """
        plans = make_update_plans([loss_units(e.sequence) for e in episodes], seed, self.config.algo, self.world_size)
        calls = [
            actor.call.remote(
                "update_shard", [episodes[i] for i in plan.indices], [advantages[i] for i in plan.indices], plan
            )
            for actor, plan in zip(self.actors, plans)
        ]
        return combine_update_stats(self._all("update", calls))

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return self._call("adapter_state")[0]

    def sync_adapter(self, version: int) -> float:
        """Every engine loads the new adapter; the seconds of the slowest worker."""
        return max(self._call("sync_adapter", version))

    def sync_info(self) -> dict[str, float]:
        """How adapters reach the engines: a transport counts as in use when any worker uses it."""
        infos = self._call("sync_info")
        return {key: max(info.get(key, 0.0) for info in infos) for key in sorted({k for i in infos for k in i})}

    def save_adapter(self, out_dir: str | os.PathLike) -> Path:
        return self._call("save_adapter", _absolute(str(out_dir)))[0]

    def training_state(self) -> dict[str, Any]:
        return self._call("training_state")[0]

    def load_training_state(self, adapter: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        import ray

        self._call("load_training_state", ray.put(adapter), ray.put(state))

    # -- checkpoint state -------------------------------------------------------------------------
    def base_fingerprint(self) -> str:
        """Hashed by rank 0 only (all workers load the same base; hashing 8B weights takes ~15 s)."""
        return self._all("base_fingerprint", [self.actors[0].call.remote("base_fingerprint")])[0]

    def load_adapter_state(self, adapter: dict[str, torch.Tensor]) -> None:
        import ray

        self._call("load_adapter_state", ray.put(adapter))

    def save_optimizer_state(self, path: str) -> None:
        """Every worker writes its optimizer shard under `path` (storage they all see)."""
        self._call("save_optimizer_state", _absolute(path))

    def load_optimizer_state(self, path: str) -> None:
        """Every worker reads its shard of a checkpoint written by any number of workers."""
        self._call("load_optimizer_state", _absolute(path))

    def rng_states(self) -> list[dict[str, Any]]:
        """Each worker's random states, by rank."""
        return self._call("rng_state")

    def load_rng_states(self, states: list[dict[str, Any]]) -> None:
        self._call("load_rng_states", states)

    def set_lr_scale(self, scale: float) -> None:
        self._call("set_lr_scale", scale)

    def resources(self) -> dict[str, float]:
        """Every worker's resource readings (`resource/<rank>/...` keys, merged)."""
        return {k: v for part in self._call("resources") for k, v in part.items()}

    def pids(self) -> list[int]:
        """Process ids of the worker actors, by rank."""
        return self._all("pid", [a.pid.remote() for a in self.actors])

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill the actors and remove the placement group (safe to call twice)."""
        self._release()

    def __enter__(self) -> RayWorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release(held: dict[str, Any]) -> None:
    """Free what a group holds; also runs when the group is garbage-collected or at exit."""
    try:
        import ray
        from ray.util.placement_group import remove_placement_group
    except ImportError:
        return
    if not ray.is_initialized():
        return
    for actor in held["actors"]:
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001 - already dead
            pass
    held["actors"].clear()
    if held["pg"] is not None:
        try:
            remove_placement_group(held["pg"])
        except Exception:  # noqa: BLE001 - already removed
            pass
        held["pg"] = None
