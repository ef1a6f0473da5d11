"""python eval.py ckpt_path=<run folder or checkpoint> [dataset=... strategy=...]

The same as the installed `hydra-dist-eval` (see docs/checkpoints.md, Using the result)."""
from framework.cli import eval_main

if __name__ == "__main__":
    eval_main()
