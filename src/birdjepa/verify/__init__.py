"""The verification wing: the harnesses that prove the harness. Each drives real runs through the
loop and checks what they leave: `fault_matrix` (every injected resume fault, each caught or harmless
as the catalogue says), `fs_fault_matrix` (the file-system faults, each in real processes: a killed
writer, a full disk, a torn log, two writers) and `divergence_matrix` (every planted divergence, found
by `bisect` at its step, tensor and code region). It sits above the loop it checks; nothing below
imports it."""
