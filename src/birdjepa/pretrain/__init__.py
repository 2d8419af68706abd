"""`birdjepa pretrain` on top of the house: the loop (`loop`), what it asks of a run segment
(`trainer`), its console and wandb mirror (`progress`, `wandb_mirror`). Nothing below imports it; the
verification wing (`birdjepa.verify`) drives it from above."""
