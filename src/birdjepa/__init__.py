"""birdjepa: exactly resumable self-supervised pretraining for bird-song encoders."""


def load_encoder(source, step=None):  # noqa: ANN001, ANN201 (the signature is birdjepa.export.encoder's)
    """A trained encoder from an export folder or a run directory: ``encoder(spectrogram) -> embedding``
    (see `birdjepa.export.encoder.load_encoder`; imported here on first use, so ``import birdjepa`` stays
    light)."""
    from birdjepa.export.encoder import load_encoder as load

    return load(source, step)
