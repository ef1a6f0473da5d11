"""The ground floor, which every layer may import and which imports nothing else of the framework: the one error
type for bad input (errors.py) and where the configs live (paths.py)."""
