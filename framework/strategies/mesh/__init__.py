"""Model parallel on one device mesh (strategy=tp, strategy=pp): the degrees dp_replicate x dp_shard x tp x pp, one
`init_device_mesh` over every worker, and, in torchtitan's order, pipeline stages cut by module name, tensor parallel
by a plan of DTensor styles, activation checkpointing, compile, FSDP2 over the data-parallel axes.

    shape.py            the degrees, each rank's coordinates on the mesh and its data-parallel rank (pure arithmetic)
    group.py            the process group workers join, with the mesh
    tensor_parallel.py  plans (module-name pattern -> style), checked in the driver and applied with parallelize_module
    pipeline_cut.py     the model's pieces, stages by split point or evenly by blocks, a stage as the model with the
                        other stages' modules None
    pipeline_run.py     the torch.distributed.pipelining schedule the loop's micro-batch goes through; evaluation's
                        forward-only pass
    p2p.py              tensors of any shape sent between stages and broadcast from one
    tied.py             a parameter two stages hold (an LM head tied to the embedding): its gradient summed over them
    precision.py        gradient clipping over TP shards and pipeline stages; autocast where FSDP2 does not cast
    checkpoints.py      DCP checkpoints whose names are the whole model's, so a run resumes on another mesh
    strategy.py         the engine: validate and check_model in the driver, join and parallelize in the workers

docs/model-parallel.md is the user's contract: the plan, split points, and what a model must allow."""
