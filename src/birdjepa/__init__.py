"""birdjepa: exactly resumable self-supervised pretraining for bird-song encoders."""
