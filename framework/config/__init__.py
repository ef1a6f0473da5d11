"""Typed configs: each group's schema (trainer.py, optimizer.py, dataset.py, strategy_options.py), the rules
they declare (rules.py), how a config node becomes its schema with one clear error (typed.py), the schemas
Hydra composes with (schemas.py, registered on import) and the whole run's settings (settings.py)."""
from framework.config import schemas  # noqa: F401  (registers the schemas in Hydra's ConfigStore)
