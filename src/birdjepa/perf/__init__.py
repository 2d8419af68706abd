"""Measurements of the step against the machine: `step_cost` (time, FLOPs, MFU)."""
