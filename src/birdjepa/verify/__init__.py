"""The verification wing: what the harness does to runs on purpose, and the harnesses that prove it
catches each. `catalogue` names every plant and fault and what must follow; `plants` and `faults`
implement them behind the core's seams (`birdjepa.seams`), registered when this package is imported
(the `birdjepa` command imports it). The matrices drive real runs through the loop and check what they
leave: `fault_matrix` (every injected resume fault, each caught or harmless as the catalogue says),
`fs_fault_matrix` (the file-system faults, each in real processes: a killed writer, a full disk, a torn
log, two writers) and `divergence_matrix` (every planted divergence, found by `bisect` at its step,
tensor and code region). It sits above the loop it checks; nothing below imports it."""

from birdjepa.verify import faults, plants

__all__ = ["faults", "plants"]
