"""When two runs differ, name the first number that differs: `replay` (re-execute a run's steps from its
run directory), `trace` and `trace_file` (record one step, everything it computes, in order), `diff`
(two traces side by side), `cli` (`birdjepa trace`, `diff-trace`, `bisect`). It takes the step and the
restore from `birdjepa.train`, below it, never from the loop."""
