"""Hydra's name lookups (hydra.utils.get_object, get_class, get_method) without the ERROR they log before they
raise: the callers here catch what they raise and say it in one line of their own (a model that does not import
printed Hydra's three lines twice before it)."""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

from hydra.utils import get_object

_HYDRA_UTILS_LOG = logging.getLogger("hydra.utils")


@contextlib.contextmanager
def quiet_lookup() -> Iterator[None]:
    disabled = _HYDRA_UTILS_LOG.disabled
    _HYDRA_UTILS_LOG.disabled = True
    try:
        yield
    finally:
        _HYDRA_UTILS_LOG.disabled = disabled


def object_at(name: str) -> Any:
    """get_object(name), raising as it does, logging nothing."""
    with quiet_lookup():
        return get_object(name)
