"""Shared pieces of the benchmark scripts in bench/: run a command and timestamp its output, run train.py,
alternate variants, report. Benchmarks only; nothing in framework/ imports this."""
