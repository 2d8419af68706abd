"""The catalogue of what the verification wing does to a run on purpose, and what must then happen.

Divergence plants (``--debug.plant P``, `birdjepa.verify.plants`) make a run differ from its twin in
exactly one thing that needs a code change (the other rows of the divergence matrix differ by an
option); `EXPECTED_DIFFERENCE` says where `birdjepa bisect` must place the first difference
(`birdjepa.verify.divergence_matrix`).

Resume faults (``--debug.inject-fault F``, `birdjepa.verify.faults`) prove the resume checks catch
each: each imitates one way a real resume goes wrong, applied to what the loop restored, before the
checks run. `EXPECTED_CHECK` names the check that must fail on the first resumed step; others may fail
too (a changed batch size also changes the next batch). `birdjepa.verify.fault_matrix` runs them all.
Plain data (no JAX).
"""

from __future__ import annotations

import typing
from typing import Literal

Fault = Literal[
    "drop_loader_state",
    "reset_prng",
    "lr_off_by_one",
    "stale_opt_state",
    "batch_size_change",
    "drop_accumulation",
    "perturb_params",
    "dataset_changed",
    "shard_relabelled",
]


FAULTS: tuple[str, ...] = typing.get_args(Fault)


#: The check each fault must trip.
EXPECTED_CHECK = {
    "drop_loader_state": "next_batch",  # the loader restarts from position 0
    "reset_prng": "prng",  # the key chain restarts from the seed
    "lr_off_by_one": "lr",  # the optimizer's step count is one ahead
    "stale_opt_state": "opt_state_norms",  # moments re-initialised, step count kept
    "batch_size_change": "config",  # --data.batch-size doubled on resume
    "drop_accumulation": "accumulation",  # the accumulated micro-gradients are lost
    "perturb_params": "param_norms",  # parameters off by 1e-6 relative
    "dataset_changed": "dataset",  # one train shard fewer
    "shard_relabelled": "dataset",  # one label of a shard changed, at the same size (a second prepare)
}


#: Relative size of the `perturb_params` fault.
PERTURBATION = 1e-6


Plant = Literal[
    "lr_schedule_shifted",
    "first_update_at_peak",
    "pos_embed_bf16",
    "loader_seed",
    "batch_reordered",
    "crop_shifted",
    "crop_shifted_late",
    "dropout_key_folded",
    "decay_skips_biases_and_norms",
    "mlp_between_fc1_and_fc2",
    "block_residual_scale",
    "decoder_input_scaled",
    "noisy_execution",
]

PLANTS: tuple[str, ...] = typing.get_args(Plant)

#: The plants the loader applies (through the seam of `birdjepa.train.segment.open_loader`): the step is
#: the twin's own, and so is its compilation.
DATA_PLANTS: tuple[str, ...] = ("loader_seed", "batch_reordered", "crop_shifted", "crop_shifted_late")

PLANT_SCALE = 1.0 + 2.0**-10
"""How much the forward plants scale one call's input: a few hundred ulps, as a changed constant would."""

LATE_STEP = 4
"""``crop_shifted_late`` shifts the crop of the first sample of this step's batch: the runs agree for
the steps before it (a late divergence, found from a common checkpoint)."""

#: Where each plant first shows: (stage, tensor) of `birdjepa trace`, the tensor name or its start.
EXPECTED_DIFFERENCE = {
    "lr_schedule_shifted": ("optimizer", "lr"),  # the scheduler advanced before the update: schedule(u + 1)
    "first_update_at_peak": ("optimizer", "lr"),  # update 0 at the peak LR, not schedule(0)
    "pos_embed_bf16": ("forward", "global/encoder/block_0.__call__#0/in"),  # the position embedding in bf16
    "loader_seed": ("batch", "index"),  # the loader's seed is the run's + 1: other samples
    "batch_reordered": ("batch", "index"),  # the same samples, each batch's rows reversed
    "crop_shifted": ("batch", "crop_offset"),  # the first sample's crop one hop later
    "crop_shifted_late": ("batch", "crop_offset"),  # the same, for the first sample of step LATE_STEP
    "dropout_key_folded": ("keys", "dropout_global"),  # the dropout key folded once more
    "decay_skips_biases_and_norms": ("updates", ""),  # no weight decay on 1-D parameters
    # Code changes inside a module whose submodules are unchanged (`birdjepa.verify.plants.ScaledCall`):
    "mlp_between_fc1_and_fc2": (
        "forward",
        "global/encoder/block_0/mlp/fc2.__call__#0/in",
    ),  # Mlp's activation
    "block_residual_scale": ("forward", "global/encoder/block_0/DropPath_0.__call__#1/in"),  # 2nd call only
    "decoder_input_scaled": ("forward", "global/decoder/embed.__call__#0/in"),  # MAE: in Decoder
}

#: ``noisy_execution`` has no entry above: it makes a run differ from *itself*, one execution from the
#: next (the first block's input scaled by `PLANT_SCALE` on every other one,
#: `birdjepa.verify.plants.execution_parity`), as a GPU's non-deterministic reductions do. Twin runs
#: started in another phase differ, and `bisect --repeat 2` must call that difference noise, not a bug.

#: Where in the code bisect must say a forward difference arose (a piece of its verdict).
EXPECTED_REGION = {
    "pos_embed_bf16": "arises in `Encoder.__call__`",
    "mlp_between_fc1_and_fc2": "the output of `encoder/block_0/mlp/fc1` is equal: the difference arises in "
    "`Mlp.__call__`",
    "block_residual_scale": "arises in `Block.__call__`",
    "decoder_input_scaled": "arises in `Decoder.__call__`",
}
