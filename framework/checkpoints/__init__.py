"""Checkpoints that are never half-written: store.py (files, manifests, validity), state.py (what a
training state holds and how it is captured and restored on every rank)."""
