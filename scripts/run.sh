#!/usr/bin/env bash
# `make run`: train on tinyshakespeare. On a machine with an NVIDIA GPU this runs the CUDA
# trainer on GPT-2 124M's shape (d12, random init); otherwise the CPU reference trainer on
# a small model (4 layers, 256 channels), 0.3 to 0.5 seconds a step on 2 cores.
# Extra arguments go to the trainer, e.g. `make run ARGS="-x 100"`.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    if [ -x ./train_gpt2cu ]; then
        echo "make run: GPU found, training with train_gpt2cu"
        # -m 7: the val shard holds 7 batches of 4 x 1024
        exec ./train_gpt2cu -e d12 -b 4 -t 1024 -x 50 -v 25 -m 7 -s 50 "$@"
    fi
    echo "make run: a GPU, but no train_gpt2cu (nvcc not found), training with the CPU reference trainer on a small model"
else
    echo "make run: no GPU here, training with the CPU reference trainer on a small model"
fi
exec ./train_gpt2cpu -e d4c256h4 -b 4 -t 64 -x 30 -l 1e-3 -v 10 -m 4 -s 30 -g 48 "$@"
