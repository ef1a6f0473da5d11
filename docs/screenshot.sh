#!/usr/bin/env bash
# How docs/tensorboard_per_rank_throughput.png was made (once, by hand; not part of CI).
# Needs Debian's chromium (apt-get install -y chromium). Run from the repository root.
set -euo pipefail
work=$(mktemp -d)
.venv/bin/python train.py strategy=ddp trainer.epochs=2 dataset.max_train_samples=16384 \
    dataset.max_test_samples=2048 trainer.log_every_n_steps=8 hydra.run.dir="$work/outputs/runs/ddp_2_ranks"
.venv/bin/python -m tensorboard.main --logdir "$work/outputs" --host 127.0.0.1 --port 6123 & tb=$!
trap 'kill $tb' EXIT
sleep 8
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,750 \
    --virtual-time-budget=15000 --screenshot="$PWD/docs/tensorboard_per_rank_throughput.png" \
    "http://127.0.0.1:6123/#scalars&tagFilter=throughput"
