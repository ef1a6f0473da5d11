"""A user's own strategy: ddp, plus one line from every rank once it has joined the process group."""
from framework.config.checks import fail, value_at
from framework.strategies.ddp import DDPStrategy


class AnnouncingDDP(DDPStrategy):
    def validate(self) -> None:
        super().validate()
        banner = value_at(self.cfg, "strategy.banner")
        if not isinstance(banner, str) or not banner.strip():
            fail("strategy.banner", banner, "expected a non-empty string")

    def setup(self) -> None:
        super().setup()
        print(f"[{self.name}] rank {self.rank}/{self.world_size} joined: {self.options.banner}", flush=True)
