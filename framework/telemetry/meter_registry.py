"""Every meter the loop runs, in the order their columns and tags come (framework/telemetry/meter.py). A new telemetry
number is a class in a file of its own and one line here (docs/architecture.md, "Add a telemetry number"); a mode's
own number (trainer.invariant's loss) is registered by that mode, at assembly."""
from __future__ import annotations

from framework.telemetry.data_time_meter import DataTimeMeter
from framework.telemetry.memory_meter import MemoryMeter
from framework.telemetry.tokens_meter import TokensMeter
from framework.telemetry.traffic import GradientBytesMeter
from framework.telemetry.wait_meter import WaitMeter

METERS = (DataTimeMeter, MemoryMeter, TokensMeter, WaitMeter, GradientBytesMeter)
