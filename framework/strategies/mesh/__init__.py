"""One torch-native mesh engine (strategy=ddp, fsdp, hsdp, tp, pp: presets of its degrees dp_replicate x dp_shard x
tp x pp): engine.py checks and joins, parallelize.py makes the model in torchtitan's order, with DDP (ddp.py) on the
1-D replicate mesh and FSDP2 and DTensors (sharded.py) on every other. docs/architecture.md lists every file here;
docs/model-parallel.md is the user's contract: the plan, split points, and what a model must allow."""
