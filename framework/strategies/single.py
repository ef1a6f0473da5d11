"""One process on one device: the first GPU when there is one, else the CPU."""
from framework.config.strategy_options import SingleOptions
from framework.strategies.base import Strategy


class SingleStrategy(Strategy):
    Options = SingleOptions
