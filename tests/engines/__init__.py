"""The engines' real runs, compared with one process (tests/conftest.py)."""
