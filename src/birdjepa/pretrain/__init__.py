"""`birdjepa pretrain` on top of the house: the loop (`loop`), what it asks of a run segment
(`trainer`), its console and wandb mirror (`progress`, `wandb_mirror`), and the fault matrix, which
drives the loop through every injected resume fault (`fault_matrix`). Nothing below imports it."""
