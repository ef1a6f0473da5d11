"""Process tests: a real process where the subject is a process (tests/conftest.py)."""
