"""The trace's digest (`birdjepa.train.digest`): equal exactly when the bits are, wherever the tensor
lives and however it is split over devices; the statistics are numpy's."""

from __future__ import annotations

import os
import subprocess
import sys

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from birdjepa.train.digest import SMALL, hex_digest, summarize


def digests(*arrays: object) -> list[str]:
    return [hex_digest(s["digest"]) for s in summarize(list(arrays), [False] * len(arrays))]


def test_one_changed_bit_or_a_swap_changes_the_digest_and_nothing_else_does() -> None:
    x = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32)
    flipped = x.copy()
    flipped.view(np.uint32)[17, 5] ^= 1  # the last bit of one element
    swapped = x.copy()
    swapped[[3, 4]] = swapped[[4, 3]]  # the same values, in another order
    signed = x.copy()
    signed[0, 0] = -0.0 if x[0, 0] == 0 else x[0, 0]
    signed_zero = np.zeros(8, np.float32), -np.zeros(8, np.float32)
    d = digests(x, x.copy(), flipped, swapped, *signed_zero)
    assert d[0] == d[1] and len({d[0], d[2], d[3]}) == 3
    assert d[4] != d[5]  # 0.0 and -0.0 are equal numbers with other bits


SPLIT = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from birdjepa.train.digest import hex_digest, summarize
x = np.random.default_rng(1).standard_normal((16, 40)).astype(np.float32)
split = jax.device_put(x, NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data")))
assert len(split.sharding.device_set) == 4
print(hex_digest(summarize([split], [False])[0]["digest"]))
"""


def test_the_same_bits_on_the_host_on_a_device_and_split_over_four_give_one_digest() -> None:
    x = np.random.default_rng(1).standard_normal((16, 40)).astype(np.float32)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, "-c", SPLIT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len({*digests(x, jnp.asarray(x)), done.stdout.strip()}) == 1


@pytest.mark.parametrize(
    "x",
    [
        np.arange(300, dtype=np.int64) * (1 << 40),  # 64-bit: JAX would narrow it; its bytes are digested
        np.linspace(-3, 3, 300).astype(ml_dtypes.bfloat16),
        np.arange(300) % 3 == 0,
        np.arange(300, dtype=np.uint8),
    ],
    ids=["int64", "bfloat16", "bool", "uint8"],
)
def test_every_dtype_a_trace_meets_is_digested_by_its_bits(x: np.ndarray) -> None:
    other = x.copy()
    other.view(np.uint8)[-1] ^= 1  # one bit of the last element
    a, b, c = digests(x, x.copy(), other)
    assert a == b != c


def test_statistics_are_numpys_and_small_tensors_are_kept_whole() -> None:
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    x[7] = np.nan
    big, small = summarize([x, x[:SMALL]], [False, False])
    assert "array" not in big and np.array_equal(small["array"], x[:SMALL], equal_nan=True)
    finite = np.where(np.isnan(x), 0.0, x)
    stats = big["stats"]
    assert np.isnan(stats[0]) and np.isnan(stats[2]) and stats[4] == 1.0  # NaN propagates, and is counted
    clean = summarize([finite], [False])[0]["stats"]
    expected = [finite.min(), finite.max(), finite.mean(), np.linalg.norm(finite)]
    np.testing.assert_allclose(clean[:4], expected, rtol=1e-5)  # float32 sums in another order
