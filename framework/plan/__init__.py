"""Will it fit? Per-rank memory of a run, planned before anything launches (docs/plan.md): the run a worker would
build, its tensors made fake (sizes without memory), two training steps counted op by op."""
