"""python eval.py ckpt_path=<run folder or checkpoint> [dataset=... strategy=...]   (see README, Using the result)

The same as the installed `hydra-dist-eval`."""
from framework.cli import eval_main

if __name__ == "__main__":
    eval_main()
