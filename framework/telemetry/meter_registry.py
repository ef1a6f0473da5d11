"""Every meter the loop runs, in the order their columns and tags come (framework/telemetry/meter.py). A new telemetry
number is a class in a file of its own and one line here (docs/architecture.md, "Add a telemetry number")."""
from __future__ import annotations

from framework.telemetry.tokens_meter import TokensMeter
from framework.telemetry.traffic import GradientBytesMeter
from framework.telemetry.wait_meter import WaitMeter

METERS = (TokensMeter, WaitMeter, GradientBytesMeter)
