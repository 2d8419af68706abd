"""How the trained probes are fitted: the recipe (written into every result's config) and its losses."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
import optax

Loss = Literal["bce", "asl"]
PROTOTYPES = 20
"""J, prototypes per class of the prototypical probe: the Bird-MAE paper's (and AudioProtoPNet's)."""


#: The probes fitted without the recipe (no loss, steps or learning rate).
UNTRAINED = ("centroid", "softmax", "knn")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How the trained probes are fitted (written into every result's config)."""

    loss: Loss = "bce"
    steps: int = 500
    lr: float = 3e-3
    weight_decay: float = 1e-3
    asl_gamma_neg: float = 4.0
    asl_gamma_pos: float = 0.0
    asl_clip: float = 0.05
    prototypes: int = PROTOTYPES
    """J of the prototypical probe."""
    token_batch: int = 32
    """Clips per step of the token probes (drawn with replacement, seeded); the pooled probes take every
    clip at every step."""
    scoring: int = 2
    """How every probe's scores are made around its fit (`multi_label_probes`), as stored results record
    it. 2: a class no train recording has scores one constant below the rest, and softmax and knn fit
    each recording's focal class. Results stored without it took a probe's own scores there (float
    noise: a cmAP moved by ~0.01 with the last bits) and a recording's first listed class."""

    def read_by(self, probe: str) -> dict[str, object]:
        """The fields ``probe``'s fit reads: a stored result fitted with other values of these is stale."""
        if probe in UNTRAINED:
            return {"scoring": self.scoring}
        only = {"token_batch": ("proto", "attentive"), "prototypes": ("proto",)}  # the rest: every probe
        return {k: v for k, v in dataclasses.asdict(self).items() if probe in only.get(k, (probe,))}

    def loss_fn(self) -> Callable[[jax.Array, jax.Array], jax.Array]:
        """Per-class loss of logits against multi-hot targets."""
        return _bce if self.loss == "bce" else partial(_asl, r=self)


def _bce(logits: jax.Array, y: jax.Array) -> jax.Array:
    return optax.sigmoid_binary_cross_entropy(logits, y)


def _asl(logits: jax.Array, y: jax.Array, r: Recipe) -> jax.Array:
    p = jax.nn.sigmoid(logits)
    p_neg = jnp.clip(p - r.asl_clip, 0.0, 1.0)  # easy negatives below the margin cost nothing
    log_p = jax.nn.log_sigmoid(logits)
    log_1mp_neg = jnp.log(jnp.clip(1.0 - p_neg, 1e-8, 1.0))
    # gamma+ = 0 leaves the power out: d/dp (1 - p)^0 is 0 * inf = NaN where a logit saturates (p = 1.0).
    pos = -log_p if r.asl_gamma_pos == 0 else -((1.0 - p) ** r.asl_gamma_pos) * log_p
    neg = -(p_neg**r.asl_gamma_neg) * log_1mp_neg
    return y * pos + (1.0 - y) * neg


def padded(n: int) -> int:
    """``n`` rounded up to a power of two: train sets padded to it compile a handful of shapes across the
    few-shot sizes, not one per n."""
    return 1 << max(n - 1, 0).bit_length()
