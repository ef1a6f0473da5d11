#!/usr/bin/env bash
# How docs/images/mlflow_sweep_runs.png and docs/images/mlflow_run_overview.png were made (by hand; not part of CI):
# a small sweep logged to MLflow (logger=[tensorboard,mlflow]), the MLflow UI on its store, headless chromium
# screenshots.
# Needs Debian's chromium and the mlflow extra. Run from the repository root; PY picks the interpreter.
set -euo pipefail
PY=${PY:-.venv/bin/python}
work=$(mktemp -d)
store="sqlite:///$work/mlflow.db"
$PY train.py -m 'logger=[tensorboard,mlflow]' "callbacks.mlflow.tracking_uri=$store" strategy=ddp \
    optimizer.lr=0.1,0.2 trainer.seed=1,2 trainer.epochs=1 dataset.max_train_samples=8192 \
    dataset.max_test_samples=2048 trainer.log_every_n_steps=8 hydra.sweep.dir="$work/outputs/multirun/lr_x_seed"
"$(dirname "$PY")/mlflow" ui --backend-store-uri "$store" --host 127.0.0.1 --port 6130 & server=$!
trap 'kill $server 2>/dev/null' EXIT
sleep 15
shot() {  # shot WIDTH,HEIGHT FILE URL
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="$1" \
        --virtual-time-budget=40000 --screenshot="$PWD/docs/images/$2" "$3"
}
experiment=$($PY -c "from mlflow.tracking import MlflowClient as C; print(C('$store').get_experiment_by_name('hydra-dist').experiment_id)")
child=$($PY -c "
from mlflow.tracking import MlflowClient as C
c = C('$store'); e = c.get_experiment_by_name('hydra-dist').experiment_id
print([r for r in c.search_runs([e]) if 'mlflow.parentRunId' in r.data.tags][0].info.run_id)")
shot 1400,700 mlflow_sweep_runs.png "http://127.0.0.1:6130/#/experiments/$experiment/runs"
shot 1800,1100 mlflow_run_overview.png "http://127.0.0.1:6130/#/experiments/$experiment/runs/$child"
