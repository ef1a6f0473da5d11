#!/usr/bin/env bash
# How the TensorBoard screenshots in docs/images/ were made (by hand; not part of CI).
# Needs Debian's chromium (apt-get install -y chromium). Run from the repository root; PY picks the interpreter.
set -euo pipefail
PY=${PY:-.venv/bin/python}
work=$(mktemp -d)
servers=()
trap 'kill "${servers[@]}" 2>/dev/null' EXIT
serve() {  # serve LOGDIR PORT: a TensorBoard in the background, stopped when the script ends
    $PY -m tensorboard.main --logdir "$1" --host 127.0.0.1 --port "$2" & servers+=($!)
}
shot() {  # shot WIDTH,HEIGHT FILE URL: a headless chromium screenshot into docs/images/FILE
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="$1" \
        --virtual-time-budget=15000 --screenshot="$PWD/docs/images/$2" "$3"
}
# docs/images/tensorboard_per_rank_throughput.png: the Scalars page, job and per-rank throughput of a plain ddp run
$PY train.py strategy=ddp trainer.epochs=2 dataset.max_train_samples=16384 \
    dataset.max_test_samples=2048 trainer.log_every_n_steps=8 hydra.run.dir="$work/outputs/runs/ddp_2_ranks"
# docs/images/tensorboard_per_gpu_charts.png: the Custom Scalars page (one chart per metric, one line per rank) of
# a ddp run whose rank 1 sleeps 20 ms in every step (the slow_rank fault), so the straggler shows
PYTHONPATH=tests/support/faults $PY train.py +callbacks.faults._target_=fault_injection.FaultInjection \
    "+callbacks.faults.plan='slow_rank:0.02:1'" strategy=ddp trainer.epochs=2 dataset.max_train_samples=16384 \
    dataset.max_test_samples=2048 trainer.log_every_n_steps=8 hydra.run.dir="$work/per_gpu/outputs/runs/ddp_rank1_slowed"
serve "$work/outputs" 6123
serve "$work/per_gpu/outputs" 6124
sleep 8
shot 1400,750 tensorboard_per_rank_throughput.png "http://127.0.0.1:6123/#scalars&tagFilter=throughput"
shot 1400,1000 tensorboard_per_gpu_charts.png "http://127.0.0.1:6124/#custom_scalars"
# docs/images/tensorboard_profile_breakdown.png: the Text tab of a ddp run profiled over steps 20-24 (trainer.profile),
# whose rank 1 sleeps 20 ms in every step: rank 0's time goes to communication (waiting in the all-reduce)
PYTHONPATH=tests/support/faults $PY train.py +callbacks.faults._target_=fault_injection.FaultInjection \
    "+callbacks.faults.plan='slow_rank:0.02:1'" strategy=ddp trainer.max_steps=30 dataset.max_train_samples=16384 \
    dataset.max_test_samples=2048 trainer.log_every_n_steps=8 "trainer.profile=[20,24]" \
    hydra.run.dir="$work/profile/outputs/runs/ddp_profiled"
serve "$work/profile/outputs" 6125
sleep 8
shot 1400,700 tensorboard_profile_breakdown.png "http://127.0.0.1:6125/#text"
