"""In-process tests: nothing here starts a process (tests/conftest.py)."""
