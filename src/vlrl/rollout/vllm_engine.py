"""The vLLM rollout engine: one in-process `vllm.LLM` per worker, serving the current LoRA adapter.

Same contract as `TransformersEngine` (see `rollout/engine.py`):

- **Exact tokens.** vLLM is prompted with our own token ids (`ChatFormat`'s), not with text. The
  one change: each image's run of `<|image_pad|>` tokens is collapsed to a single placeholder,
  because vLLM's multimodal processor expands every placeholder itself. The expanded prompt vLLM
  reports back is compared with ours, so a mismatch (another image size, another processor
  config) is an error, never silent drift between what was sampled and what is trained on.
- **Log-probs of the sampled distribution.** The engine runs with
  `logprobs_mode="processed_logprobs"`: log-softmax of logits / temperature after the vision
  special tokens are banned (a -inf `logit_bias`) — what `algo.grpo.token_logprobs` computes.
  Not `bad_words`: vLLM applies those in a Python loop over every request and word at every
  decode step; the bias is one batched add.
  vLLM's default (`raw_logprobs`) would ignore both the temperature and the ban. With
  `top_p < 1` vLLM's processed log-probs are also renormalised over the nucleus, while the
  trainer's are not; keep `rollout.top_p=1` (the default) for unbiased policy gradients anyway.
- **Stops** on `<|im_end|>` only (`generation_config="vllm"`: the model's generation_config.json,
  which may list more end tokens, is not read), as the transformers engine does.
- **Seeds.** Every prompt of a call gets its own seed (`seed * 100_003 + index * n`; vLLM gives
  the k-th of n samples `seed + k`), so identical conversations in one batch still draw
  independent samples and a seeded rollout is reproducible.
- **LoRA sync in memory.** `LoRARequest` only names a directory. A small hook in the worker's
  LoRA manager (`vllm_compat.install_memory_lora_loader`, through `collective_rpc`, so it works
  in-process and across processes) builds the adapter from tensors we hand over, loaded under a
  fresh id and name each version: vLLM caches adapters (and prefix-cache KV blocks) by id and
  name, so reusing them would serve stale weights. When the hook cannot be installed, or a load
  through it fails while the same adapter loads from files, the engine switches for good to
  files in /dev/shm (a fresh directory and id per version, deleted once the next is loaded) and
  says so in the log and in the `sync/transport_*` metrics.
- **Vision-tower LoRA.** vLLM ignores adapter tensors on the vision tower (vllm-project/vllm#32541),
  so it would sample from another policy than the one trained. The engine sends vLLM only the
  language-model half and merges the vision half into the served vision weights itself.
- **Merged-weight rollouts** (`lora_mode="merged"`, `rollout.lora_mode`): vLLM starts without
  LoRA and each sync writes W = W0 + scale * B @ A into vLLM's own weight tensors, computed in
  fp32 from an untouched base W0 (the policy's frozen `base_layer` weights on the same device, or
  a pristine copy of the LoRA-targeted checkpoint tensors the engine keeps) and rounded once.
  Language and vision LoRA go the same way. `vllm_compat` says how the tensors get in (`direct`
  `model.load_weights` in place on GPU, `reload_weights` where the CPU build repacked them).
- **Colocation.** On GPUs the engine is built with sleep mode and drops its KV cache while the
  policy trains. `sleep_level=1` moves the weights to host memory and back, a round trip of the
  whole model per step. `sleep_level=2` (merged mode, `lora_mode.resolve_sleep_level`) drops
  them: the next sync (or a wake without one) rewrites every checkpoint tensor from the base on
  the same GPU, the LoRA-targeted ones merged, so the weights never leave the device. On CPU
  there is no sleep mode: both calls are skipped (logged once).

vLLM's CPU worker, when it runs in our process, reseeds the global RNGs and replaces
`torch.set_num_threads` with a no-op; the engine undoes both after start-up so the trainer in the
same process behaves as with the transformers engine.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from vlrl.errors import VlrlError
from vlrl.models import vision_merge
from vlrl.rollout import vllm_compat as compat
from vlrl.rollout.engine import Completion, RolloutEngine, SamplingParams
from vlrl.rollout.sequence import MultimodalSequence
from vlrl.rollout.vllm_setup import (  # noqa: F401  (import_vllm, vllm_lora_config: re-exported)
    import_vllm,
    preserve_process_state,
    vllm_lora_config,
    vllm_max_lora_rank,
)
from vlrl.rollout.write_plan import MergeProgram, WritePlan

log = logging.getLogger(__name__)


# vLLM accepts only these values for max_lora_rank; the adapter's rank is rounded up to one.
def collapse_image_placeholders(token_ids: list[int], image_token_id: int) -> tuple[list[int], int]:
    """Each run of image placeholder tokens becomes one token (vLLM expands it again);
    returns the ids and the number of runs (= images)."""
    out: list[int] = []
    runs = 0
    previous = None
    for t in token_ids:
        if t == image_token_id:
            if previous == image_token_id:
                continue
            runs += 1
        out.append(t)
        previous = t
    return out, runs


class VLLMEngine(RolloutEngine):
    """`vllm.LLM` behind the rollout-engine interface (see the module docstring)."""

    name = "vllm"
    shares_policy = False  # its own copy of the base weights: every sync sends the adapter
    llm: Any = None  # the `vllm.LLM`; None once closed

    def __init__(
        self,
        model_dir: str | os.PathLike,
        tokenizer: Any,
        suppress_token_ids: list[int],
        *,
        eos_token_id: int,
        lora_config: dict[str, Any],
        dtype: str = "float32",
        max_model_len: int = 4096,
        max_images: int = 1,
        max_num_seqs: int = 64,
        kv_cache_memory_mb: int = 256,
        gpu_memory_utilization: float = 0.5,
        use_gpu: bool = False,
        seed: int = 0,
        adapter_transport: str = "memory",
        lora_mode: str = "adapter",
        sleep_level: int = 1,
        sleep_unmap: str = "all",
        base_source: Any = None,
        base_resident: bool = False,
        lora_compute_dtype: str = "base",
        extra_args: dict[str, Any] | None = None,
    ):
        try:
            vllm = import_vllm()
        except ImportError as exc:
            raise VlrlError(
                "rollout.engine is 'vllm' but vLLM is not installed; run scripts/setup-vllm-venv.sh "
                "(CPU) or install vllm, or set rollout.engine=transformers"
            ) from exc
        if adapter_transport not in ("memory", "disk"):
            raise VlrlError(f"adapter_transport must be 'memory' or 'disk', got {adapter_transport!r}")
        if lora_mode not in ("adapter", "merged"):
            raise VlrlError(f"lora_mode must be 'adapter' or 'merged', got {lora_mode!r}")
        if lora_mode == "merged" and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0").strip() != "0":
            raise VlrlError(_MERGED_NEEDS_IN_PROCESS)
        self.lora_mode = lora_mode
        if sleep_level not in (1, 2) or (sleep_level == 2 and lora_mode != "merged"):
            raise VlrlError(
                f"sleep_level must be 1, or 2 with lora_mode 'merged'; got sleep_level={sleep_level!r}, {lora_mode!r}"
            )
        self.sleep_level = sleep_level
        if sleep_unmap not in ("all", "large"):
            raise VlrlError(f"sleep_unmap must be 'all' or 'large', got {sleep_unmap!r}")
        self.sleep_unmap = sleep_unmap  # level 2: LLM.sleep (all), or release_for_rewrite (large)
        self._weights_dropped = False  # level 2: asleep, or awake with weights not yet rewritten
        self._served: dict[str, torch.Tensor] = {}  # level 2: the adapter last merged, to rewrite on a wake
        # names -> iterator of (checkpoint name, W0) in that order; None: the engine's own pristine copy
        self.base_source = base_source
        # base_source yields the same tensors at every call (one worker: the policy's own), so a
        # MergeProgram may hold them; the engine's pristine copy always stays where it is.
        self._base_resident = base_resident or base_source is None
        self._program: MergeProgram | None = None  # the write plan bound to its tensors (write_plan.py)
        self._program_plan: WritePlan | None = None  # the plan it was bound from
        self._loader_names: list[str] = []  # with a program: the tensors it leaves to vLLM's loader
        self._merge_names: list[str] | None = None  # checkpoint tensors rewritten per sync (merged mode)
        self._lora_names: set[str] = set()
        self._base_shapes: dict[str, tuple[int, ...]] = {}  # of W0, seen at the first merge
        self._pristine: dict[str, torch.Tensor] | None = None
        self.merge_path = ""  # merged mode: direct | reload (vllm_compat.weights_load_path)
        self._write_plan: WritePlan | None = None  # direct path: where vLLM's loader put each tensor
        self.served_dtype = getattr(torch, dtype) if dtype in ("float32", "bfloat16", "float16") else None
        # The dtype A and B enter the merge in: the trainer's (model.lora.compute_dtype; `base` on
        # a 16-bit base casts them under autocast), so the served W is the trained policy's.
        half = self.served_dtype in (torch.bfloat16, torch.float16)
        self.factor_dtype = self.served_dtype if lora_compute_dtype == "base" and half else torch.float32
        self.tokenizer = tokenizer
        self.eos_id = eos_token_id
        self.use_gpu = use_gpu
        self.lora_config = dict(lora_config)
        self.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        # -inf, not the -100 vLLM's own constructor clamps to: the trainer's support excludes these ids.
        self.logit_bias = {int(i): float("-inf") for i in suppress_token_ids}
        self._version = 0
        self._lora_request: Any = None
        self._next_lora_id = 1
        self._asleep = False
        self._released = False  # asleep through vllm_compat.release_for_rewrite, not LLM.sleep
        self._release_ok: bool | None = None  # whether this vLLM allows it (asked once)
        self.sleep_stats: dict[str, float] = {}  # the last such sleep: what it unmapped and kept
        self._warned_no_sleep = False
        self._adapter_dirs: list[Path] = []
        self._tmp_root: Path | None = None
        self.sync_times: list[float] = []  # seconds per update_adapter, in order
        self.sync_phases: dict[str, float] = {}  # merged mode: the last sync's seconds by phase
        self.ignore_eos = False  # benchmarks force every completion to its full length

        kwargs: dict[str, Any] = dict(
            model=str(model_dir),
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            limit_mm_per_prompt={"image": max(1, max_images), "video": 0},
            max_num_seqs=max_num_seqs,
            generation_config="vllm",
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
        )
        if lora_mode == "adapter":
            kwargs.update(
                enable_lora=True,
                max_lora_rank=vllm_max_lora_rank(int(self.lora_config["r"])),
                max_loras=1,
                max_cpu_loras=1,
            )
        if use_gpu:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
        else:
            # The CPU backend must be told its KV-cache size; CUDA graphs do not exist there.
            kwargs.update(kv_cache_memory_bytes=int(kv_cache_memory_mb) << 20, enforce_eager=True)
        kwargs.update(extra_args or {})  # e.g. compilation_config for a benchmark's CUDA-graph sizes
        start = time.perf_counter()
        with preserve_process_state():
            try:
                self.llm = vllm.LLM(**kwargs)
            except Exception as exc:  # vLLM raises many types; the first line says what is wrong
                raise VlrlError(f"vLLM could not start on {model_dir}: {_first_line(exc)}") from exc
        self.startup_s = time.perf_counter() - start
        self.model_dir = str(model_dir)
        self._vision_base: dict[str, torch.Tensor] | None = None  # base weights under the vision LoRA
        self.vision_load = ""  # how merged vision weights went in: copy | reload (vllm_compat.load_vision_weights)
        self.adapter_transport = adapter_transport if lora_mode == "adapter" else "merged"
        # Merged mode: a fresh prefix-cache salt per weight version instead of a reset (vllm_compat).
        self._salt_prompts = lora_mode == "merged" and compat.prompts_take_cache_salt()
        self._cache_salt: str | None = None
        self._merges = 0
        if lora_mode == "merged":
            if not compat.engine_in_process(self.llm):
                self.close()
                raise VlrlError(_MERGED_NEEDS_IN_PROCESS)
        elif adapter_transport == "memory" and not all(self.llm.collective_rpc(compat.install_memory_lora_loader)):
            self._fall_back_to_files("this vLLM has no hook for in-memory LoRA loading")
        log.info(
            "vLLM %s engine up in %.1f s (%s, %s)",
            vllm.__version__,
            self.startup_s,
            "GPU" if use_gpu else "CPU",
            "LoRA merged into the weights" if lora_mode == "merged" else f"adapters by {self.adapter_transport}",
        )

    # -- adapter -----------------------------------------------------------------------------
    @property
    def adapter_version(self) -> int:
        return self._version

    def update_adapter(self, state: dict[str, torch.Tensor], version: int) -> float:
        """Serve these LoRA weights from now on, under a fresh adapter id; the previous one is dropped.

        `state` must be the caller's own copy (the worker's gathered adapter is): in memory, the
        engine keeps these tensors until the next version is served instead of copying them again.
        The language-model half goes through vLLM's LoRA (in memory, or files when that fails);
        the vision-tower half, which vLLM would silently ignore, is merged into the served vision
        weights (`vllm_compat` explains both).
        """
        start = time.perf_counter()
        if self.lora_mode == "merged":
            # At level 2 the weights are mapped back first and the KV cache after the merge's
            # kernels are queued, so that its mapping (host-side driver calls) overlaps the merge
            # on the GPU; the merge rewrites every weight, so the wake does not rewrite them first.
            split_wake = self.use_gpu and self._asleep and self.sleep_level == 2
            if split_wake:
                self._map_back("weights")
            else:
                self.wake_up(rewrite=False)
                if self.use_gpu:
                    torch.cuda.synchronize()
            woken = time.perf_counter()
            try:
                self._merge_and_load(state, version)
            finally:
                queued = time.perf_counter()
                if split_wake:
                    self._map_back("kv_cache")
                    self._asleep = self._released = False
                kv_woken = time.perf_counter()
            if self.sleep_level == 2:
                self._keep_served(state)
            self._version = version
            if self.use_gpu:
                torch.cuda.synchronize()  # the time is the sync's, not the next generate's
            end = time.perf_counter()
            elapsed = end - start
            self.sync_times.append(elapsed)
            # Where a sync's time goes: mapping the slept memory back, or the merge and its write
            # (the wait for its kernels included).
            wake = (woken - start) + (kv_woken - queued)
            self.sync_phases = {
                "sync_wake_s": wake,
                "sync_wake_kv_s": kv_woken - queued,
                "sync_merge_s": elapsed - wake,
                "sync_merge_host_s": queued - woken,  # the host's share: until the last kernel is queued
            }
            log.info(
                "vLLM weights v%d merged (%s, %d tensors) in %.3f s", version, self.merge_path, len(state), elapsed
            )
            return elapsed
        # A sleeping engine's weights and LoRA slots are not in GPU memory.
        self.wake_up()
        language, vision = vision_merge.split_adapter_state(state)
        if vision or self._vision_base is not None:
            # First: a weight reload drops vLLM's loaded adapters (0.32), so the LoRA comes after.
            self._load_vision(vision, version)
        lora_id = self._load_lora(language, version)
        self._version = version
        elapsed = time.perf_counter() - start
        self.sync_times.append(elapsed)
        log.info(
            "vLLM adapter v%d loaded (id %d, %s%s) in %.3f s",
            version,
            lora_id,
            self.adapter_transport,
            ", vision tower merged" if vision else "",
            elapsed,
        )
        return elapsed

    def _load_lora(self, tensors: dict[str, torch.Tensor], version: int) -> int:
        """Load the language-model LoRA under a fresh id; falls back from memory to files for good
        when the in-memory path fails but the same adapter loads from files."""
        lora_id = self._next_lora_id
        self._next_lora_id += 1
        try:
            self._add_lora(tensors, version, lora_id, self.adapter_transport)
        except Exception as exc:
            first = _first_line(exc)
            if self.adapter_transport != "memory":
                raise VlrlError(f"vLLM refused adapter version {version}: {first}") from exc
            # Is it the hook (another vLLM's internals) or the adapter? Files decide.
            lora_id = self._next_lora_id
            self._next_lora_id += 1
            try:
                self._add_lora(tensors, version, lora_id, "disk")
            except Exception as exc2:
                raise VlrlError(f"vLLM refused adapter version {version}: {_first_line(exc2)}") from exc2
            self._fall_back_to_files(f"loading adapter version {version} from memory failed ({first})")
            self.llm.collective_rpc(compat.keep_memory_adapter, args=(None,))  # drop what the hook still holds
        if self.adapter_transport == "memory":
            self.llm.collective_rpc(compat.keep_memory_adapter, args=(lora_id,))
        else:
            for old in self._adapter_dirs[:-1]:  # vLLM holds the loaded weights; old files are done
                shutil.rmtree(old, ignore_errors=True)
            self._adapter_dirs = self._adapter_dirs[-1:]
        return lora_id

    def _add_lora(self, tensors: dict[str, torch.Tensor], version: int, lora_id: int, transport: str) -> None:
        from vllm.lora.request import LoRARequest

        name = f"vlrl-v{version}-{lora_id}"  # unique: vLLM keys adapters and prefix-cache blocks by name
        if transport == "memory":
            self.llm.collective_rpc(compat.register_memory_adapter, args=(lora_id, tensors, self.lora_config))
            path = f"{compat.MEMORY_PREFIX}{lora_id}"
        else:
            path = str(self._write_adapter_dir(lora_id, tensors))
        request = LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)
        # Loads now (so the time is the sync's); vLLM validates the new adapter before it evicts
        # the served one, so a bad adapter leaves the previous version in service.
        compat.add_lora_or_raise(self.llm, request)
        if self._lora_request is not None:
            self.llm.llm_engine.remove_lora(self._lora_request.lora_int_id)  # usually evicted already (one slot)
        self._lora_request = request

    def _fall_back_to_files(self, why: str) -> None:
        where = compat.adapter_scratch_dir() or tempfile.gettempdir()
        log.warning("%s; adapters now go through files in %s, a fresh id per version (transport: disk)", why, where)
        self.adapter_transport = "disk"

    # -- merged mode ------------------------------------------------------------------------
    def _merge_and_load(self, state: dict[str, torch.Tensor], version: int) -> None:
        """W = W0 + scale * B @ A for every LoRA-targeted weight (language and vision), computed in
        fp32 from the untouched base and rounded once to the served dtype, written into vLLM's
        weights in place. Everything is checked before the first tensor is written, so an adapter
        that does not fit leaves the served weights as they were."""
        pairs = vision_merge.lora_pairs(state)
        if self._merge_names is None:
            self.merge_path = self.llm.collective_rpc(compat.weights_load_path)[0]
            names = set(pairs)
            if self.sleep_level == 2:  # a wake finds no weights at all: every tensor is rewritten
                names |= set(vision_merge.checkpoint_tensor_names(self.model_dir))
            if self.merge_path == "reload":
                # A layer-wise reload must see every part of a fused module (q, k and v of qkv_proj):
                # the parts without LoRA go in unchanged, from the same base.
                names |= _fused_siblings(names, self.llm.collective_rpc(compat.packed_modules)[0])
            self._merge_names = sorted(names)
            self._lora_names = set(pairs)
        elif set(pairs) != self._lora_names:
            raise VlrlError(f"adapter version {version} has LoRA on other modules than the previous one")
        for name, (a, b) in pairs.items():
            shape = self._base_shapes.get(name)
            if a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0] or (shape and shape != (b.shape[0], a.shape[1])):
                raise VlrlError(
                    f"adapter version {version}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} of {name} "
                    f"do not fit the base weight {shape or ''}"
                )
        scale = vision_merge.lora_scale(self.lora_config)
        dtype = self.served_dtype
        plan = self._write_plan
        record = self.merge_path == "direct" and plan is None
        program = self._program if self._program_plan is plan else None
        if program is None and plan is not None and len(plan) and self._base_resident:
            program = self._program = self._bind_program(plan, pairs, scale)
            self._program_plan = plan
        # What the program does not cover goes through the per-tensor loop below.
        names = self._merge_names if program is None else self._loader_names

        def merged():
            """The merged tensors for vLLM's loader; those with a place in the write plan are
            written there instead, as the loader consumes this (one weight alive at a time)."""
            for name, base in self._base_weights(names):
                self._base_shapes[name] = tuple(base.shape)
                pair = pairs.get(name)
                targets = plan.targets.get(name, []) if plan is not None else []
                out = targets[0] if targets else None
                with torch.no_grad():
                    if pair is None:
                        tensor = base.to(dtype or base.dtype) if out is None else out.copy_(base)
                    else:
                        to = dtype if out is None else out.dtype
                        tensor = vision_merge.merge_lora(base, *pair, scale, name, to, self.factor_dtype, out=out)
                    for other in targets[1:]:
                        other.copy_(tensor)
                if out is None:
                    yield name, tensor

        weights = merged()
        try:
            if program is not None:
                program.load(pairs)
                program.run()
            if self.merge_path == "reload":
                weights = list(weights)  # a reload may look at the names first
            recorded = compat.load_merged_weights(
                self.llm, weights, self.merge_path, reset_prefix_cache=not self._salt_prompts, record=record
            )
            if record:
                self._write_plan = recorded
                log.info(
                    "vLLM merged weights: %d tensors written in place from now on, %d through vLLM's loader",
                    len(recorded),
                    len(recorded.loader_only),
                )
            self._weights_dropped = False
        except VlrlError:
            raise
        except Exception as exc:
            if plan is not None and len(plan):
                # Every merge writes every tensor from W0, so the same merge through vLLM's loader
                # alone repairs whatever the plan wrote before it failed.
                log.warning("writing merged weights through the plan failed (%s); vLLM's loader from now on", exc)
                self._write_plan, self._program, self._program_plan = WritePlan(), None, None
                return self._merge_and_load(state, version)
            raise VlrlError(
                f"this vLLM could not take the merged weights of adapter version {version} in place "
                f"({_first_line(exc)}); use rollout.lora_mode=adapter"
            ) from exc
        self._merges += 1
        if self._salt_prompts:  # KV blocks of earlier weights can no longer be matched
            self._cache_salt = f"vlrl-weights-{self._merges}"

    def _keep_served(self, state: dict[str, torch.Tensor]) -> None:
        """Level 2: keep a copy of the adapter just merged, for a wake to rewrite the same weights
        (the state may be the policy's live LoRA tensors, which the next update changes). The
        buffers are made once and refilled in one call."""
        if set(self._served) != set(state) or any(self._served[k].shape != v.shape for k, v in state.items()):
            self._served = {k: torch.empty_like(v) for k, v in state.items()}
        with torch.no_grad():
            torch._foreach_copy_(list(self._served.values()), [state[k] for k in self._served])

    def _bind_program(self, plan: WritePlan, pairs: dict, scale: float) -> MergeProgram:
        """The write plan bound to W0 and its views for every tensor it covers (`MergeProgram`);
        the rest (`_loader_names`) keeps going through vLLM's loader."""
        covered = [n for n in self._merge_names if plan.targets.get(n)]
        bases = dict(self._base_weights(covered))
        for name, base in bases.items():
            self._base_shapes[name] = tuple(base.shape)
        merges = [(n, bases[n], plan.targets[n]) for n in covered if n in pairs]
        copies = [(bases[n], plan.targets[n]) for n in covered if n not in pairs]
        covered_set = set(covered)
        self._loader_names = [n for n in self._merge_names if n not in covered_set]
        log.info(
            "vLLM merged weights: a merge program for %d LoRA weights and %d copies; %d tensors through the loader",
            len(merges),
            len(copies),
            len(self._loader_names),
        )
        return MergeProgram(merges, copies, scale, self.factor_dtype)

    def _base_weights(self, names: list[str]):
        """(checkpoint name, W0) in `names`' order: from `base_source` (the policy's frozen
        weights), else from the pristine copy read once from the checkpoint onto the engine's device."""
        if self.base_source is not None:
            yield from self.base_source(names)
            return
        if self._pristine is None:
            device = f"cuda:{torch.cuda.current_device()}" if self.use_gpu else "cpu"
            self._pristine = vision_merge.read_checkpoint_tensors(self.model_dir, set(names), device)
        for name in names:
            yield name, self._pristine[name]

    def _load_vision(self, vision: dict[str, torch.Tensor], version: int) -> None:
        """Merge the adapter's vision-tower LoRA into the served vision weights (see vllm_compat)."""
        pairs = vision_merge.vision_lora_pairs(vision)
        if self._vision_base is None:
            self._vision_base = vision_merge.read_checkpoint_tensors(self.model_dir, set(pairs))
        elif set(pairs) != set(self._vision_base):
            raise VlrlError(f"adapter version {version} has LoRA on other vision modules than the previous one")
        merged = vision_merge.merged_vision_weights(self._vision_base, pairs, self.lora_config)
        try:
            self.vision_load = compat.load_vision_weights(self.llm, sorted(merged.items()))
        except Exception as exc:
            raise VlrlError(
                f"this vLLM could not load the merged vision-tower weights of adapter version {version} "
                f"({_first_line(exc)}); train without model.lora.include_vision or use rollout.engine=transformers"
            ) from exc

    def _write_adapter_dir(self, lora_id: int, state: dict[str, torch.Tensor]) -> Path:
        """A PEFT adapter directory in a worker-local temporary folder (never shared storage)."""
        from safetensors.torch import save_file

        if self._tmp_root is None:
            self._tmp_root = Path(tempfile.mkdtemp(prefix="vlrl-vllm-adapters-", dir=compat.adapter_scratch_dir()))
        out = self._tmp_root / f"adapter-{lora_id}"
        out.mkdir()
        save_file(
            {k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(out / "adapter_model.safetensors")
        )
        (out / "adapter_config.json").write_text(
            json.dumps({"peft_type": "LORA", **self.lora_config}), encoding="utf-8"
        )
        self._adapter_dirs.append(out)
        return out

    # -- generation --------------------------------------------------------------------------
    def generate(self, prompts: list[MultimodalSequence], params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        self.wake_up()
        requests, sampling = [], []
        for index, prompt in enumerate(prompts):
            ids, runs = collapse_image_placeholders(prompt.token_ids, self.image_token_id)
            if runs != len(prompt.images):
                raise VlrlError(f"prompt {index} has {runs} image placeholder runs but {len(prompt.images)} images")
            request: dict[str, Any] = {"prompt_token_ids": ids}
            if self._cache_salt is not None:
                request["cache_salt"] = self._cache_salt
            if prompt.images:
                request["multi_modal_data"] = {"image": list(prompt.images)}
            requests.append(request)
            seed = None if params.seed is None else params.seed * 100_003 + index * params.n
            sampling.append(self._sampling_params(params, seed))
        outputs = self.llm.generate(requests, sampling, lora_request=self._lora_request, use_tqdm=False)
        results: list[list[Completion]] = []
        for index, (prompt, out) in enumerate(zip(prompts, outputs)):
            if list(out.prompt_token_ids) != prompt.token_ids:
                raise VlrlError(
                    f"vLLM expanded prompt {index}'s image placeholders into other tokens than our processor "
                    f"({len(out.prompt_token_ids)} vs {len(prompt.token_ids)} tokens); do vLLM and vlrl read the "
                    "same preprocessor_config.json?"
                )
            results.append([self._completion(c) for c in out.outputs])
        return results

    def _sampling_params(self, params: SamplingParams, seed: int | None):
        import vllm

        return vllm.SamplingParams(
            n=params.n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            top_k=0,
            max_tokens=params.max_new_tokens,
            stop_token_ids=[] if self.ignore_eos else [self.eos_id],
            ignore_eos=self.ignore_eos,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,
            logit_bias=dict(self.logit_bias) or None,
            logprobs=0,  # only the sampled token's
            seed=seed,
            detokenize=bool(params.stop),  # stop strings need text; our text is decoded from the ids
        )

    def _completion(self, output: Any) -> Completion:
        ids = list(output.token_ids)
        if output.finish_reason not in ("stop", "length"):
            raise VlrlError(f"vLLM ended a completion with finish_reason={output.finish_reason!r}")
        logprobs = [float(step[token].logprob) for token, step in zip(ids, output.logprobs)]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(ids, logprobs, text, output.finish_reason)

    # -- colocation --------------------------------------------------------------------------
    def sleep(self) -> None:
        """GPU: release the KV cache and move weights to CPU memory (level 1), or drop them (level 2),
        while the policy trains.

        Level 2 with `sleep_unmap="large"`, once a merge has set up the rewrite: vLLM's allocations
        are unmapped by `vllm_compat.release_for_rewrite` (the KV cache and the large weight
        allocations; the next wake rewrites every weight anyway), not by `LLM.sleep(level=2)`,
        which also walks the prefix cache and maps every small allocation back at the wake. Where
        that hook does not work, `LLM.sleep`."""
        if not self.use_gpu:
            if not self._warned_no_sleep:
                log.info("vLLM sleep mode does not exist on CPU; the engine keeps its memory while the policy trains")
                self._warned_no_sleep = True
            return
        if self._asleep:
            return
        if self.sleep_level == 2 and self.sleep_unmap == "large" and self._served and self._release_allowed():
            try:
                self.sleep_stats = self.llm.collective_rpc(
                    compat.release_for_rewrite, args=(RELEASE_MIN_WEIGHT_BYTES,)
                )[0]
                self._released = True
            except Exception as exc:
                log.warning("unmapping vLLM's memory ourselves failed (%s); LLM.sleep from now on", _first_line(exc))
                self.llm.collective_rpc(compat.remap_released)  # whatever was unmapped before the failure
                self._release_ok = False
        if not self._released:
            self.llm.sleep(level=self.sleep_level)
        self._asleep = True
        self._weights_dropped = self.sleep_level == 2

    def _release_allowed(self) -> bool:
        if self._release_ok is None:
            self._release_ok = bool(all(self.llm.collective_rpc(compat.can_release_for_rewrite)))
            if not self._release_ok:
                log.info("this vLLM's sleep-mode allocator has no handles to release by hand; LLM.sleep(level=2)")
        return self._release_ok

    def _map_back(self, tag: str) -> None:
        """Map one of vLLM's memory tags (weights, kv_cache) back after a sleep."""
        if self._released:
            self.llm.collective_rpc(compat.remap_released, args=(tag,))
        else:
            self.llm.wake_up(tags=[tag])

    def wake_up(self, rewrite: bool = True) -> None:
        """GPU: bring weights and KV cache back before rollouts (a no-op when awake or on CPU).

        After a level-2 sleep the weights are rewritten from the base and the adapter last merged
        (`rewrite`; `update_adapter` passes False: its merge writes them all anyway)."""
        if self.use_gpu and self._asleep:
            if self._released:
                self.llm.collective_rpc(compat.remap_released)
            else:
                self.llm.wake_up()
            self._asleep = self._released = False
        if rewrite and self._weights_dropped:
            if not self._served:
                raise VlrlError("vLLM's weights were dropped (sleep level 2) and no merged adapter is kept to rewrite")
            self._merge_and_load(self._served, self._version)

    def close(self) -> None:
        """Stop the engine and delete its temporary adapter files."""
        llm = self.llm
        if llm is not None:
            if self._released:  # vLLM frees what it believes is mapped: give it back first
                llm.collective_rpc(compat.remap_released)
                self._released = False
            shutdown = getattr(llm.llm_engine, "engine_core", None)
            if shutdown is not None and hasattr(shutdown, "shutdown"):
                shutdown.shutdown()
            self.llm = None
        if self._tmp_root is not None:
            shutil.rmtree(self._tmp_root, ignore_errors=True)
            self._tmp_root = None


# A level-2 sleep of a merging engine unmaps weight allocations from this size up; smaller ones stay
# mapped (vllm_compat.handles_to_release: mapping back costs per allocation). At 8B shape that keeps
# the attention projections and the small tensors, ~4 GiB, and unmaps the MLPs and embeddings.
RELEASE_MIN_WEIGHT_BYTES = 64 << 20

_MERGED_NEEDS_IN_PROCESS = (
    "rollout.lora_mode=merged writes the weights into vLLM's model in place, which needs vLLM's engine core in "
    "this process (VLLM_ENABLE_V1_MULTIPROCESSING=0); with this engine use rollout.lora_mode=adapter"
)


def _fused_siblings(names: set[str], packed: dict[str, list[str]]) -> set[str]:
    """Checkpoint names of the other parts of each fused module one of `names` belongs to
    (`...q_proj.weight` -> `...k_proj.weight`, `...v_proj.weight` with `{"qkv_proj": [q, k, v]}`)."""
    out: set[str] = set()
    for name in names:
        module, _, leaf = name.rpartition(".")
        parent, _, part = module.rpartition(".")
        for parts in packed.values():
            if part in parts:
                out |= {f"{parent}.{p}.{leaf}" for p in parts if p != part}
    return out - names


def _first_line(exc: BaseException) -> str:
    """The line of an exception that says what is wrong (for pydantic's errors: the first message)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):  # pydantic ValidationError: "1 validation error for ..." says nothing
        try:
            return str(errors()[0].get("msg", "")).split(". ")[0] or type(exc).__name__
        except Exception:
            pass
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
