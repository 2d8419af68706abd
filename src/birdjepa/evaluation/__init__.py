"""Frozen-encoder evaluation: embed labelled splits, score them with a linear probe and kNN, beside the
random-init and raw log-mel baselines (`birdjepa evaluate`, and the trainer's ``eval/…`` metrics)."""
