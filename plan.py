"""python plan.py [the same overrides as train.py] [plan.gpu=NAME]   e.g.
    python plan.py strategy=single,ddp,fsdp strategy.nproc_per_node=1,2,4 model=lenet plan.gpu=T4-16GB

Per-rank memory of the run for each strategy and number of workers, before anything launches (docs/plan.md). The
same as the installed `hydra-dist-plan`."""
from framework.plan.command import main

if __name__ == "__main__":
    main()
