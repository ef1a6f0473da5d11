"""The optional engines (DeepSpeed, Horovod) are extras: a run of any other strategy trains in a process where
importing them fails, and the driver's and workers' modules never import them. Fresh interpreters, since this one
has imported both by now; what a strategy says when its engine is missing: tests/unit/test_engine_options.py."""
import os
import subprocess
import sys

from support.processes import REPO, TINY, TRAIN, check_ok, pin_accelerator

WITHOUT_ENGINES = ("import runpy, sys; sys.modules['horovod'] = None; sys.modules['deepspeed'] = None; "
                   "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def test_other_strategies_train_without_deepspeed_or_horovod(tmp_path):
    """train.py in a process where `import horovod` and `import deepspeed` fail, as on a machine without them (None
    in sys.modules is Python's own way to make an import fail)."""
    check_ok(subprocess.run([sys.executable, "-c", WITHOUT_ENGINES, str(TRAIN),
                             *pin_accelerator(["strategy=single", *TINY, "trainer.max_steps=2"])], cwd=tmp_path,
                            capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONUNBUFFERED": "1"}))


def test_the_driver_and_worker_modules_never_import_an_engine():
    check = ("import sys, framework.run, framework.worker, framework.strategies, framework.cli; "
             "found = [m for m in ('deepspeed', 'horovod') if m in sys.modules]; print(*found); sys.exit(1 if found else 0)")
    proc = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"imported: {proc.stdout} {proc.stderr}"
