"""Checkpoints that are never half-written: store.py (files, manifests, validity), state.py (the loop's own part of
a checkpoint: RNG states, data position, totals; framework/strategies/checkpoint_io.py holds model and optimizer),
position.py (where a run stands in its data), manager.py (when to write, which one to resume), disk.py (room on
disk)."""
