"""Helpers of the tests (tests/conftest.py lists them)."""
