"""A worker: the policy and its rollout engine on one device.

The trainer talks to workers only through the `WorkerGroup` protocol (`vlrl.runtime.worker_api`:
rollout, update, adapter sync, state), which a `Worker` satisfies, so the same loop drives one
in-process worker or a group of Ray actors (`vlrl.runtime.worker_group.RayWorkerGroup`, one
`Worker` per actor; `make_worker_group` picks).

One worker (`world_size == 1`): the engine shares the policy's module, so the adapter it samples
with is the one just trained and a sync only bumps the version.

W workers: each holds an FSDP2 shard of the policy (`vlrl.runtime.distributed`) and an engine
with its OWN full copy of the base model and LoRA adapter (generation on a sharded model would
all-gather every layer for every token). `sync_adapter` gathers the full adapter from the shards
(LoRA weights only, in memory) and loads it into the engine.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vlrl.config import RunConfig
from vlrl.envs.base import Task
from vlrl.errors import VlrlError
from vlrl.eval.evaluate import EvalResult
from vlrl.models.loading import ensure_model, worker_device
from vlrl.rollout.engine import RolloutEngine, SamplingParams
from vlrl.rollout.episodes import Episode, RolloutStats, run_episodes
from vlrl.rollout.factory import build_engine, resolve_engine_name, sampling_params
from vlrl.rollout.sequence import ChatFormat
from vlrl.runtime import distributed
from vlrl.runtime.update_plan import UpdatePlan, UpdateStats
from vlrl.runtime.worker_api import WorkerGroup
from vlrl.training.policy import Policy
from vlrl.training.seeding import rng_state, seed_everything, set_rng_state

if TYPE_CHECKING:
    from vlrl.observability.resources import ResourceMonitor


class Worker:
    """Holds a LoRA policy (trainable, FSDP-sharded across workers) and a rollout engine that samples from it."""

    def __init__(
        self,
        config: RunConfig,
        total_optimizer_steps: int,
        adapter_dir: str | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
    ):
        from vlrl.models.loading import vision_special_token_ids
        from vlrl.models.processor import load_processor

        self.config = config
        self.rank, self.world_size = rank, world_size
        self._monitor: ResourceMonitor | None = None  # started by the first `resources` call
        self._base_params: dict[str, torch.nn.Parameter] | None = None  # by checkpoint name, for merged mode
        self.adapter_dir = adapter_dir
        if config.runtime.torch_threads:
            torch.set_num_threads(config.runtime.torch_threads)
        self.device = worker_device(config)
        if world_size > 1:
            if master_port is None:
                raise ValueError("a worker of a group needs the rendezvous port of rank 0 (master_port)")
            distributed.init_process_group(
                rank, world_size, master_addr, master_port, self.device, config.runtime.collective_timeout_s
            )
        seed_everything(config.train.seed)
        model_dir = ensure_model(config.model)
        self.model_dir = model_dir
        self.processor = load_processor(model_dir)
        self.chat = ChatFormat(self.processor)
        self.reference_adapter: str | None = None  # set by _lora_model when the KL reference is the warm start
        self.model = self._lora_model(trainable=True)
        if config.train.gradient_checkpointing:
            from vlrl.models.loading import enable_activation_checkpointing

            enable_activation_checkpointing(self.model)
        if world_size > 1:
            distributed.shard_policy(self.model, self.device)
        else:
            self.model.to(self.device)
        self.suppress = vision_special_token_ids(self.processor)
        self.pad_id = self.chat.pad_id
        self.policy = Policy(
            self.model,
            config,
            self.suppress,
            self.pad_id,
            total_optimizer_steps,
            world_size=world_size,
            reference_adapter=self.reference_adapter,
        )
        self.engine = self._make_engine()
        if not self.engine.shares_policy:
            self.sync_adapter(0)  # the engine's copy starts from the policy's adapter

    def _lora_model(self, trainable: bool):
        """The base model with the run's LoRA adapter: the starting adapter when given, else fresh."""
        from vlrl.models.loading import load_policy_model
        from vlrl.models.lora import add_reference_adapter, apply_lora, load_adapter

        c = self.config
        base = load_policy_model(self.model_dir, dtype=c.model.dtype, attn_implementation=c.model.attn_implementation)
        if self.adapter_dir:
            # Continue from an existing adapter (e.g. the SFT warm start); its LoRA shape wins.
            # The engine's copy skips the base check: the policy's load has just done it.
            model = load_adapter(base, self.adapter_dir, is_trainable=trainable, verify_base=trainable)
            if trainable and c.algo.kl_coef > 0:
                # The KL reference is the policy GRPO starts from: a frozen second copy of the warm
                # start, not the base (docs/architecture.md, "Reference policy").
                self.reference_adapter = add_reference_adapter(model, self.adapter_dir)
            return model
        lo = c.model.lora
        # The engine's copy must not draw from the global RNG (it would shift everything after it);
        # its weights are overwritten by the first sync anyway.
        seed = None if trainable else c.train.seed
        return apply_lora(base, lo.rank, lo.alpha, lo.dropout, lo.target_modules, lo.include_vision, seed=seed)

    def _make_engine(self) -> RolloutEngine:
        """The rollout engine (`rollout.factory.build_engine`). One worker: the transformers engine
        shares the policy's module. A group: it gets its own full copy of the model (its adapter
        is overwritten by the first sync). vLLM always holds its own copy of the base weights and
        never shares the policy's module; it starts from the policy's adapter (fresh, or the warm
        start) at the first sync, and every sync sends the gathered adapter weights."""
        name = resolve_engine_name(self.config.rollout.engine)
        shares = name == "transformers" and self.world_size == 1
        model = self.model
        if name == "transformers" and not shares:
            model = self._lora_model(trainable=False).to(self.device).eval()
            model.requires_grad_(False)
        merging = {}
        if name == "vllm" and self.config.rollout.merged_base == "policy":
            merging["base_source"] = self._policy_base_weights  # W0 for merged mode: the policy's frozen base
            # One worker hands out its parameters themselves (the same tensors every sync); a group
            # all-gathers each weight anew.
            merging["base_resident"] = self.world_size == 1
        return build_engine(
            self.config,
            self.chat,
            model,
            engine=name,
            shares_policy=shares,
            model_dir=self.model_dir,
            world_size=self.world_size,
            **merging,
        )

    # -- the calls the trainer makes -------------------------------------------------------
    def sampling_params(self, greedy: bool = False, seed: int | None = None) -> SamplingParams:
        return sampling_params(self.config, greedy, seed)

    def rollout(
        self, tasks: list[Task], group_size: int, params: SamplingParams, stats: RolloutStats | None = None
    ) -> list[Episode]:
        if not tasks:
            return []
        self.engine.wake_up()
        return run_episodes(
            self.engine,
            self.chat,
            self.config.env,
            tasks,
            group_size,
            params,
            self.config.rollout.max_model_len,
            stats,
            exploring_starts=self.config.algo.exploring_starts,
        )

    def evaluate(self, tasks: list[Task], greedy: bool, label: str, seed: int | None = None) -> EvalResult:
        """One episode per task with the current adapter (an `EvalResult`)."""
        from vlrl.eval.evaluate import evaluate_engine

        self.engine.wake_up()
        seed = self.config.train.seed if seed is None else seed
        return evaluate_engine(self.engine, self.chat, self.config, tasks, greedy=greedy, label=label, seed=seed)

    def update(self, episodes: list[Episode], advantages: list[float], seed: int) -> UpdateStats:
        """The whole update on this worker (one worker only; a group sends each worker its plan)."""
        if self.world_size > 1:
            raise VlrlError("a worker of a group updates through update_shard with its plan (RayWorkerGroup.update)")
        self.engine.sleep()
        return self.policy.update(episodes, advantages, seed)

    def update_shard(
        self, episodes: list[Episode], advantages: list[float], plan: UpdatePlan
    ) -> list[dict[str, float]]:
        """This worker's part of a data-parallel update; per-step partial stats (`combine_update_stats`)."""
        self.engine.sleep()
        return self.policy.run_plan(episodes, advantages, plan)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The full adapter weights on CPU (every worker of a group must call it: it gathers shards)."""
        return distributed.gather_adapter_state(self.model)

    def sync_adapter(self, version: int) -> float:
        """Hand the engine the adapter just trained; returns the seconds it took (gather + load).

        An engine that merges the adapter into its weights (vLLM, `rollout.lora_mode=merged`) gets
        the LoRA tensors where they are (the policy's device, all-gathered there on a group) and
        the policy's frozen base weights as W0 (`_policy_base_weights`): nothing goes through host
        memory on the colocated path.
        """
        start = time.perf_counter()
        state = {} if self.engine.shares_policy else self._engine_adapter_state(self.engine)
        self.engine.update_adapter(state, version)
        return time.perf_counter() - start

    def _engine_adapter_state(self, engine: RolloutEngine) -> dict[str, torch.Tensor]:
        """The full adapter for `engine`: on the policy's device for a merging engine, else CPU copies."""
        return distributed.gather_adapter_state(self.model, to_cpu=engine.lora_mode != "merged")

    def _policy_base_weights(self, names: list[str]):
        """(checkpoint name, W0) for `names`, in that order, from the policy's frozen base weights
        (PEFT's `base_layer.weight` under a LoRA layer, the plain weight elsewhere): on one worker
        the tensors themselves, no copy; on a group each is all-gathered (`full_tensor`) when the
        engine reaches it, so every worker must ask for the same names in the same order (the
        adapter's names are the same everywhere) and only one full weight is alive at a time."""
        from torch.distributed.tensor import DTensor

        if self._base_params is None:
            params: dict[str, torch.nn.Parameter] = {}
            for pname, param in self.model.named_parameters():
                clean = pname.replace("._checkpoint_wrapped_module", "").replace("._orig_mod", "")
                clean = clean.removeprefix("base_model.model.")
                params[clean.replace(".base_layer.", ".")] = param
            self._base_params = params
        for name in names:
            param = self._base_params.get(name)
            if param is None:
                raise VlrlError(f"the policy has no base weight {name}; cannot merge its LoRA for the rollout engine")
            yield name, (param.full_tensor() if isinstance(param, DTensor) else param).detach()

    def sync_info(self) -> dict[str, float]:
        """How adapters reach this worker's engine, as step-record values (empty when it shares the policy)."""
        transport = self.engine.adapter_transport
        if transport is None:
            return {}
        phases = getattr(self.engine, "sync_phases", None) or {}
        return {
            "sync/transport_memory": float(transport == "memory"),
            "sync/transport_disk": float(transport == "disk"),
            "sync/lora_merged": float(self.engine.lora_mode == "merged"),
            **{f"time/{k}": v for k, v in phases.items()},
        }

    def save_adapter(self, out_dir: str | os.PathLike) -> Path:
        """Write the adapter directory (rank 0 writes; every worker of a group must call it)."""
        from vlrl.models.fingerprint import model_fingerprint
        from vlrl.models.lora import save_adapter

        if self.world_size == 1:
            return Path(save_adapter(self.model, out_dir, model_fingerprint(self.model_dir)))
        state = self.adapter_state()
        if self.rank != 0:
            return Path(out_dir)
        # The engine's copy is a plain PEFT model with the same adapter config: it writes the
        # gathered weights (its own stay as they are).
        # (the vLLM engine holds no PEFT module: then the policy's own wrapper writes them).
        writer = self.engine.model if self.engine.model is not None else self.model
        return Path(save_adapter(writer, out_dir, model_fingerprint(self.model_dir), state_dict=state))

    # -- state, for checkpoints (every worker of a group must make each call) ---------------
    def base_fingerprint(self) -> str:
        """The fingerprint of the base weights this worker trains on (hashed once per process)."""
        from vlrl.models.fingerprint import model_fingerprint

        return model_fingerprint(self.model_dir)

    def load_adapter_state(self, adapter: dict[str, torch.Tensor]) -> None:
        """Put full adapter weights (from `adapter_state`, any number of workers) into the policy."""
        distributed.load_adapter_state(self.model, adapter)

    def save_optimizer_state(self, path: str) -> None:
        """Write optimizer and LR-scheduler state to the directory `path` (DCP; on a group each
        worker writes its own shard). `path` is a local directory or an fsspec URL."""
        distributed.save_optimizer_checkpoint(self.model, self.policy.optimizer, self.policy.scheduler, path)

    def load_optimizer_state(self, path: str) -> None:
        """Read optimizer and LR-scheduler state written by any number of workers (resharded to this one)."""
        distributed.load_optimizer_checkpoint(self.model, self.policy.optimizer, self.policy.scheduler, path)

    def rng_state(self) -> dict[str, Any]:
        """This process's random states (Python, NumPy, torch CPU and CUDA), as JSON."""
        return rng_state()

    def rng_states(self) -> list[dict[str, Any]]:
        """Random states per rank (one entry here; a group returns one per worker)."""
        return [rng_state()]

    def load_rng_states(self, states: list[dict[str, Any]]) -> None:
        """Restore this rank's random states from a per-rank list. A rank the list does not
        reach (a checkpoint of fewer workers) keeps the state it was seeded with."""
        if self.rank < len(states):
            set_rng_state(states[self.rank])

    def training_state(self) -> dict[str, Any]:
        """Optimizer (full, keyed by parameter name) and scheduler state in memory; on a group, rank
        0's is complete (checkpoints use `save_optimizer_state`, which writes shards).

        A copy: on one worker torch hands out the live tensors, which AdamW updates in place, and
        a guard's `skip` needs the state as it was before the update."""
        return copy.deepcopy(
            {
                "optimizer": distributed.optimizer_state(self.model, self.policy.optimizer),
                "scheduler": self.policy.scheduler.state_dict(),
            }
        )

    def load_training_state(self, adapter: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        """Restore adapter weights, optimizer and scheduler (from any number of workers)."""
        distributed.load_adapter_state(self.model, adapter)
        distributed.load_optimizer_state(self.model, self.policy.optimizer, state["optimizer"])
        self.policy.scheduler.load_state_dict(state["scheduler"])
        # The scheduler's state does not reach the optimizer: put the LR of its last step back
        # (an optimizer state from before the first step holds no param groups to restore it).
        for group, lr in zip(self.policy.optimizer.param_groups, self.policy.scheduler.get_last_lr()):
            group["lr"] = lr

    def set_lr_scale(self, scale: float) -> None:
        """Learning rate = train.lr x scale x the schedule, from the next optimizer step on (guard rollbacks)."""
        self.policy.set_lr_scale(scale)

    def resources(self) -> dict[str, float]:
        """This worker's host memory and (on a GPU) utilisation and peak memory since the last
        call, as `resource/<rank>/...` record keys (`vlrl.observability.resources`)."""
        from vlrl.observability.resources import ResourceMonitor

        if self._monitor is None:
            self._monitor = ResourceMonitor(self.rank)
        return self._monitor.snapshot()

    def close(self) -> None:
        """Stop the engine and the resource monitor; leave the process group."""
        self.engine.close()
        if self._monitor is not None:
            self._monitor.close()
        if self.world_size > 1:
            distributed.destroy_process_group()


def make_worker_group(config: RunConfig, total_optimizer_steps: int, init_adapter: str | None = None) -> WorkerGroup:
    """The trainer's workers: one in-process `Worker` (runtime.backend=local) or a `RayWorkerGroup`
    of `runtime.num_workers` of them; both are a `WorkerGroup`."""
    if config.runtime.backend == "local":
        return Worker(config, total_optimizer_steps, adapter_dir=init_adapter)
    from vlrl.runtime.worker_group import RayWorkerGroup

    return RayWorkerGroup(config, total_optimizer_steps, init_adapter, worker_cls=Worker)
