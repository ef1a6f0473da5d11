"""A user's own strategy: ddp, plus one option of its own and one line from every rank once it has joined the
process group. Its options are a dataclass (the schema the driver types strategy.* with): ddp's, plus `banner`."""
from dataclasses import dataclass

from framework.config.rules import non_empty_text, rule
from framework.config.strategy_options import DDPOptions
from framework.strategies.ddp import DDPStrategy


@dataclass
class AnnouncingOptions(DDPOptions):
    banner: str = rule("hello", non_empty_text())  # what every rank says when it has joined


class AnnouncingDDP(DDPStrategy):
    Options = AnnouncingOptions

    def setup(self) -> None:
        super().setup()
        print(f"[{self.name}] rank {self.rank}/{self.world_size} joined: {self.options.banner}", flush=True)
