"""What the run's config makes of the rollout: which engine samples, and how.

`resolve_engine_name` picks the engine (`rollout.engine`: auto, transformers or vllm) and checks
that vLLM imports when it is asked for; `sampling_params` turns `rollout.*` into the
`SamplingParams` of training rollouts or greedy evaluation. The choice lives here, above both
engines, so the engine interface (`engine.py`) never imports an implementation of itself.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Literal

from vlrl.config import RunConfig
from vlrl.errors import VlrlError
from vlrl.rollout.engine import SamplingParams

log = logging.getLogger(__name__)


def sampling_params(config: RunConfig, greedy: bool = False, seed: int | None = None) -> SamplingParams:
    """Sampling of training rollouts (or greedy decoding) from the run's config."""
    r = config.rollout
    return SamplingParams(
        temperature=0.0 if greedy else r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens, seed=seed
    )


def resolve_engine_name(requested: Literal["auto", "transformers", "vllm"]) -> str:
    """`auto` means vLLM where it imports, else transformers; asking for a missing (or broken) vLLM is an error."""
    if requested not in ("auto", "transformers", "vllm"):
        raise VlrlError(f"unknown rollout.engine {requested!r}; choose auto, transformers or vllm")
    if requested == "transformers":
        return requested
    problem = _vllm_problem()
    if requested == "auto":
        if problem and importlib.util.find_spec("vllm") is not None:
            log.warning("rollout.engine=auto: %s, so the transformers engine is used", problem)
        return "transformers" if problem else "vllm"
    if problem:
        raise VlrlError(
            f"rollout.engine is 'vllm' but {problem}; install it (CPU: scripts/setup-vllm-venv.sh, "
            "see docs/vllm.md) or set rollout.engine=transformers"
        )
    return requested


def _vllm_problem() -> str | None:
    """Why vLLM cannot be used here (not installed, or fails to import), or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    try:
        from vlrl.rollout.vllm_engine import import_vllm

        import_vllm()  # the engine needs it anyway; a broken install shows up here
    except VlrlError as exc:  # e.g. a version outside the supported range: its own line says it
        return str(exc)
    except Exception as exc:  # e.g. a torchvision without its C++ ops
        lines = str(exc).strip().splitlines()
        return f"vLLM does not import ({type(exc).__name__}: {lines[0] if lines else ''})"
    return None
