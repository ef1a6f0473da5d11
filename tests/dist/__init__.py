"""Distributed units on a persistent gloo world (tests/conftest.py)."""
