"""What a process uses: host memory always, GPU utilisation and memory where a GPU exists.

Two ways to read it:

- `snapshot()`: an instant reading, a flat dict (names below), e.g. for the driver at scrape time.
- `ResourceMonitor(worker)`: for a training worker. On a GPU it samples in a background thread
  (once a second), so `snapshot()` returns the MEAN utilisation and the PEAK memory since the
  previous call, i.e. over one training step, not one instant at the step's end (when the GPU
  may well be idle). Its keys are record keys, `resource/<worker>/<name>`, ready to merge into
  the trainer's step record; the exporter (`metrics.py`) turns them into metrics labelled
  `worker` (and `gpu`).

Names (values are floats):

    process_resident_memory_bytes     RSS of this process                    always (Linux /proc, else psutil)
    host_memory_used_bytes            total - available, whole machine       always (idem)
    host_memory_total_bytes                                                  always (idem)
    gpu/<i>/utilization_percent       NVML: % of time a kernel ran           GPU only, needs nvidia-ml-py
    gpu/<i>/memory_used_bytes         device memory in use (all processes)   GPU only (NVML, else torch)
    gpu/<i>/memory_total_bytes                                               GPU only (NVML, else torch)

`<i>` is the GPU's NVML index on its host (what `nvidia-smi` shows), so two workers of one node
never collide. Which GPUs a process reports: those in CUDA_VISIBLE_DEVICES (what Ray gives each
worker), or every GPU of the host when it is unset. On a machine without a GPU (or without NVML
and CUDA) the gpu/* names are simply absent: no zeros that would look like an idle GPU.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_NVML_LOCK = threading.Lock()
_NVML_READY: bool | None = None  # None: not tried yet


def _nvml() -> Any | None:
    """The pynvml module, initialised once per process; None without nvidia-ml-py or a driver."""
    global _NVML_READY
    with _NVML_LOCK:
        if _NVML_READY is None:
            try:
                import pynvml  # nvidia-ml-py (the `metrics` extra)

                pynvml.nvmlInit()
                _NVML_READY = True
            except Exception:  # no package, no driver, no device: all mean "no NVML here"
                _NVML_READY = False
        if not _NVML_READY:
            return None
        import pynvml

        return pynvml


def host_memory() -> dict[str, float]:
    """RSS of this process and used/total memory of the machine, in bytes."""
    out: dict[str, float] = {}
    try:
        with open("/proc/self/statm") as f:
            out["process_resident_memory_bytes"] = float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
        info: dict[str, int] = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024  # kB
        out["host_memory_total_bytes"] = float(info["MemTotal"])
        out["host_memory_used_bytes"] = float(info["MemTotal"] - info.get("MemAvailable", info.get("MemFree", 0)))
        return out
    except (OSError, ValueError, KeyError):
        pass
    try:  # not Linux: psutil comes with Ray
        import psutil

        vm = psutil.virtual_memory()
        return {
            "process_resident_memory_bytes": float(psutil.Process().memory_info().rss),
            "host_memory_total_bytes": float(vm.total),
            "host_memory_used_bytes": float(vm.total - vm.available),
        }
    except Exception:
        return out


def visible_gpus(nvml: Any) -> list[int]:
    """NVML indices of the GPUs this process may use (CUDA_VISIBLE_DEVICES, by index or UUID)."""
    count = nvml.nvmlDeviceGetCount()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    out: list[int] = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        if item.isdigit():
            if int(item) < count:
                out.append(int(item))
            continue
        for index in range(count):  # a UUID (GPU-...; MIG instances are not resolved here)
            uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if uuid == item or uuid.startswith(item):
                out.append(index)
    return out


def gpu_readings() -> dict[str, float]:
    """Instant utilisation and memory of each visible GPU (`gpu/<i>/...`); {} without a GPU."""
    nvml = _nvml()
    out: dict[str, float] = {}
    if nvml is not None:
        try:
            for index in visible_gpus(nvml):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                out[f"gpu/{index}/utilization_percent"] = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                out[f"gpu/{index}/memory_used_bytes"] = float(memory.used)
                out[f"gpu/{index}/memory_total_bytes"] = float(memory.total)
            return out
        except Exception:  # a GPU that vanished or errs: report nothing rather than fail a step
            return {}
    return _torch_gpu_memory()


def _torch_gpu_memory() -> dict[str, float]:
    """Memory of the visible GPUs through torch when NVML is missing (no utilisation then)."""
    import sys

    torch = sys.modules.get("torch")  # never import torch (slow) just for this
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    out: dict[str, float] = {}
    for device in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(device)
        out[f"gpu/{device}/memory_used_bytes"] = float(total - free)
        out[f"gpu/{device}/memory_total_bytes"] = float(total)
    return out


def snapshot() -> dict[str, float]:
    """Host memory and (where present) GPU readings of this process, right now."""
    return {**host_memory(), **gpu_readings()}


def resource_record(worker: str | int, readings: dict[str, float]) -> dict[str, float]:
    """Readings as step-record keys `resource/<worker>/<name>` (what the exporter maps)."""
    return {f"resource/{worker}/{name}": value for name, value in readings.items()}


class ResourceMonitor:
    """A worker's resources over a training step: mean GPU utilisation, peak memory.

    `snapshot()` returns record keys for this worker and starts the next interval. Without a
    GPU there is no thread: host memory is read on the call.
    """

    def __init__(self, worker: str | int, interval_s: float = 1.0):
        self.worker = worker
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if gpu_readings():
            self._thread = threading.Thread(target=self._run, name=f"vlrl-resources-{worker}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            reading = gpu_readings()
            with self._lock:
                self._samples.append(reading)

    def snapshot(self) -> dict[str, float]:
        """Readings since the previous call, as `resource/<worker>/...` record keys."""
        now = gpu_readings()
        with self._lock:
            samples, self._samples = self._samples + [now], []
        merged: dict[str, float] = {}
        for key in {k for s in samples for k in s}:
            values = [s[key] for s in samples if key in s]
            if key.endswith("utilization_percent"):
                merged[key] = sum(values) / len(values)
            else:  # memory: the peak matters (what nearly ran out)
                merged[key] = max(values)
        return resource_record(self.worker, {**host_memory(), **merged})

    def close(self) -> None:
        """Stop the sampling thread (if any)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
