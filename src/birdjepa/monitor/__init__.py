"""Training-health monitors (pure modules, wired into the trainer separately); see ``updates``."""
