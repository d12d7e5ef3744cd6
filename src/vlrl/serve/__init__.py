"""Serving trained adapters: vLLM's OpenAI-compatible server behind a verified base, hot swaps, play.

  adapters.py  public and internal adapter names, base-fingerprint checks
  server.py    `vlrl serve`: verify, then run vLLM's API server as a child process (VllmServer)
  routing.py   the ASGI middleware inside that server: API key on every path, public-name routes,
               runtime base checks, readiness
  swap.py      hot swap and rollback through the running server (swap_adapter, rollback_adapter)
  play.py      `vlrl play`: the env's episodes with the openai client, scored like `vlrl eval`

Importing this package (and `adapters`, `routing`, `swap`, `server`) needs neither vLLM nor torch;
`play` needs torch (it shares the evaluation code). How to use it: docs/serving.md.
"""

from vlrl.serve.adapters import AdapterSpec, adapter_spec, parse_adapter_option
from vlrl.serve.server import ServeOptions, VllmServer, require_vllm, verify_adapters
from vlrl.serve.swap import ServeClient, SwapResult, rollback_adapter, swap_adapter, swap_to

__all__ = [
    "AdapterSpec",
    "ServeClient",
    "ServeOptions",
    "SwapResult",
    "VllmServer",
    "adapter_spec",
    "parse_adapter_option",
    "require_vllm",
    "rollback_adapter",
    "swap_adapter",
    "swap_to",
    "verify_adapters",
]
