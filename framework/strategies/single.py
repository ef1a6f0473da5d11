"""One process on one device: the first GPU when there is one, else the CPU."""
from framework.strategies.base import Strategy


class SingleStrategy(Strategy):
    name = "single"
