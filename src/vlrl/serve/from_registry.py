"""`--registry NAME@ALIAS`: the adapter version a registry alias points to, as something to serve.

The registry (`vlrl.tracking.registry`) references adapter directories by path, so the served
directory is the registered one (it must be readable by the server at that path, e.g. on shared
storage). The public name is `NAME-ALIAS` (`maze-3f2a9c0d1b7e@production` -> served as
`maze-3f2a9c0d1b7e-production`), the version tag `v<N>`; an adapter whose files changed since
registration is refused, like the registry refuses to promote it.
"""

from __future__ import annotations

from pathlib import Path

from vlrl.errors import VlrlError
from vlrl.serve.adapters import AdapterSpec, adapter_spec


def parse_registry_ref(ref: str) -> tuple[str, str]:
    """`NAME@ALIAS` -> (NAME, ALIAS)."""
    name, sep, alias = ref.partition("@")
    if not sep or not name or not alias:
        raise VlrlError(f"--registry takes NAME@ALIAS (e.g. maze-3f2a9c0d1b7e@production), got {ref!r}")
    return name, alias


def registry_adapter(
    ref: str, config_path: str | Path | None = None, uri: str | None = None
) -> tuple[AdapterSpec, str]:
    """(what to serve, the version number as text) for `NAME@ALIAS` in the registry of the run
    config at `config_path` (default settings when None) or at `uri`."""
    from vlrl.config import load_config
    from vlrl.tracking.registry import AdapterRegistry

    name, alias = parse_registry_ref(ref)
    registry = AdapterRegistry.from_config(load_config(config_path, []), uri)
    info = registry.show(name, f"@{alias}")
    if info["files"] != "unchanged":
        raise VlrlError(
            f"{name} v{info['version']} ({alias}): its adapter at {info['source']} is {info['files']} since "
            "registration; register it again before serving it"
        )
    spec = adapter_spec(f"{name}-{alias}", info["source"], tag=f"v{info['version']}")
    return spec, str(info["version"])
