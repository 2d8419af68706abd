"""XLA settings that make a step's result independent of thread timing.

On CPU, XLA's multi-threaded Eigen kernels split reductions across threads in a timing-dependent way:
a run resumed in a new process then drifts from the uninterrupted one in the last bits after a few
steps (measured: the first resumed step's invariance loss differed at 3e-7 relative). Single-threaded
Eigen makes every step bit-reproducible; on GPU the deterministic-ops flag plays the same role.
The flags are read when JAX first initialises its backend, so call this before any computation.

On CPU, the size of XLA's intra-op thread pool is an input to the arithmetic too. XLA sizes it
max($PJRT_NPROC or the schedulable cores, the process's device count) and splits work over it, and
the split of some reductions and matrix products changes their order of addition. Measured at XLA's
default level on 2 cores: the same one-device executable gave other bits in a process with 4
simulated devices (a pool of 4) than in one with 1 (a pool of 2), from the clip normalisation's mean
(a YNNPACK reduction) onwards; with YNNPACK off, from the patch embedding's matrix product (Eigen).
`deterministic_xla` therefore sets $PJRT_NPROC, unless the user did, to at least `MIN_CPU_THREADS`:
1, 2, 4 or 8 devices then share one pool (`--train.virtual-shards`, `birdjepa trace` on one device).
The suite's -O0 hid it: at -O0 neither kernel library takes these ops.

They make a step reproducible on one kind of machine. XLA compiles for the device it runs on (on CPU,
for the host's instruction set and its thread pool), and another JAX or XLA version may compile a step
otherwise, so the last bits can differ between machines: `machine_kind` names what they depend on,
and checkpoints record it.

One flag here saves time and memory, not bits: `IN_PLACE`. The step is given its parameters and both
AdamW moments to update in place (donated), and reads the old ones around the writes (the update's
direction, the metrics' update norm, the monitor's cond). XLA's default copy insertion on a CPU could not
order those reads before the writes and copied all three first (485 copies at the small preset). Its
region-based analysis can: the moments are updated in place, and only the new parameters pass through a
buffer of their own, copied into place after the last read of the old ones. The same bits, 0.90-0.97x
the step's time and 9 % less of XLA's memory at small and base on a CPU (docs/benchmarks.md, "The state
updated in place").
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

from birdjepa.cores import schedulable_cpus

IN_PLACE = "--xla_cpu_copy_insertion_use_region_analysis=true"
"""The donated state updated in place on a CPU, without XLA's copies of it first (see above). Its GPU
twin is not set: no GPU has compared the two."""

FLAGS = ("--xla_cpu_multi_thread_eigen=false", "--xla_gpu_deterministic_ops=true", IN_PLACE)

MIN_CPU_THREADS = 8
"""The CPU thread pool's least size: the device counts a virtual-shard run moves between (1, 2, 4, 8)
all fit under it, on any machine. More threads than cores costs little: on 2 cores a step took 1.02x
(small preset) to 1.16x (tiny) the time with a pool of 2 (docs/benchmarks.md, "The CPU thread pool")."""


def overridden_flags() -> list[str]:
    """The determinism flags `XLA_FLAGS` gives another value (a cluster's module or a job script):
    kept, as the user's, where they made a run's bits depend on thread timing without a word."""
    given = os.environ.get("XLA_FLAGS", "").split()
    return [g for f in FLAGS[:2] for g in given if g.split("=")[0] == f.split("=")[0] and g != f]


def deterministic_xla() -> list[str]:
    """Add the determinism flags (and `IN_PLACE`) to XLA_FLAGS and fix the CPU thread pool
    (``PJRT_NPROC``: at least `MIN_CPU_THREADS`, more where there are more cores), keeping whatever the
    user set. Returns what it set (the flags, and ``PJRT_NPROC``), empty where all was set already."""
    current = os.environ.get("XLA_FLAGS", "")
    missing = [f for f in FLAGS if f.split("=")[0] not in current]
    if missing:
        os.environ["XLA_FLAGS"] = " ".join([current, *missing]).strip()
    if "PJRT_NPROC" not in os.environ:
        os.environ["PJRT_NPROC"] = str(max(schedulable_cpus(), MIN_CPU_THREADS))
        missing.append("PJRT_NPROC")
    return missing


#: Why a process where JAX computes in 64 bits (``$JAX_ENABLE_X64``) cannot train or restore a run:
#: float64 parameters against float32 checkpoints, said as "another shape" or a leaf's dtype (blaming the
#: checkpoint).
X64_WHY = "birdjepa trains and checkpoints in float32: unset it"


def x64_refusal() -> str | None:
    """`X64_WHY` with the variable's value where JAX computes in 64 bits; None where it computes in 32."""
    import jax

    if not jax.config.jax_enable_x64:
        return None
    return f"$JAX_ENABLE_X64={os.environ.get('JAX_ENABLE_X64', 'on')!r}: {X64_WHY}"


def deterministic_xla_from(caller: str) -> None:
    """`deterministic_xla` for a library call (``caller``, e.g. "birdjepa.load_encoder") in a process the
    ``birdjepa`` command did not start: its numbers then equal the command's bit for bit (an encoder's
    embeddings moved by 3e-7 in 33 of 72 rows without it). A WARNING where JAX's backend had started
    before: XLA read its flags and sized its thread pool then, and those stay."""
    late = deterministic_xla()
    try:
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:  # another JAX: nothing to say
        return
    if late and backends_are_initialized():
        print(f"WARNING {caller}: JAX started before it could set {', '.join(late)}, so its numbers may "
              "differ in the last bits from the birdjepa command's; call it before any JAX computation, or "
              "birdjepa.train.determinism.deterministic_xla() first", flush=True)  # fmt: skip


def cpu_threads(n_devices: int) -> int:
    """The size of XLA's CPU thread pool in a process with ``n_devices`` CPU devices: ``PJRT_NPROC``
    read as XLA reads it, an integer at least 1 (-1 and 0 ran one thread, recorded as the core count:
    a resume under another value failed next_gradient, not as another kind of machine)."""
    try:
        threads = max(int(os.environ.get("PJRT_NPROC", "")), 1)
    except ValueError:  # unset, or no number: XLA's default
        threads = schedulable_cpus()
    return max(threads, n_devices)


#: Widest first: the vector instruction set XLA's CPU code can use on this host.
CPU_ISAS = ("avx512f", "avx2", "avx", "sse4_2")


def cpu_model() -> str:
    """The host CPU's model name and widest vector instruction set, e.g. "AMD EPYC (avx512f)"."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return platform.processor() or platform.machine()
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines())}
    flags = set(fields.get("flags", "").split())
    isa = next((i for i in CPU_ISAS if i in flags), platform.machine())
    return f"{fields.get('model name', platform.machine())} ({isa})"


#: The lock of every Python dependency, in the source tree this package runs from (`make build`).
LOCK_FILE = Path(__file__).resolve().parents[3] / "uv.lock"


def lock_hash() -> str:
    """The first 12 hex digits of uv.lock's SHA-256, or "none" (installed without the source tree)."""
    try:
        return hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()[:12]
    except OSError:
        return "none"


def machine_kind() -> dict[str, str]:
    """What a step's last bits depend on besides its inputs and options: the JAX and jaxlib versions, the
    device (the GPU's name; on CPU, the host's model and instruction set, its thread pool's size and the
    LAPACK kernels its OpenBLAS picked), the dependency lock the environment was installed from
    (another lock can bring another XLA), the XLA flags (an optimisation level set for one segment
    moved the last bits of every step after it, every resume check passing) and JAX's settings that move
    numbers (`JAX_NUMERICS`)."""
    import jax
    import jaxlib

    device = jax.devices()[0]
    kind = {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "xla_flags": xla_flags(),
            "jax_config": jax_numerics()}  # fmt: skip
    if device.platform != "cpu":
        return {**kind, "device": device.device_kind, "lock": lock_hash()}
    threads = str(cpu_threads(jax.local_device_count()))
    return {**kind, "device": cpu_model(), "lock": lock_hash(), "cpu_threads": threads,
            "lapack": lapack_kernels()}  # fmt: skip


JAX_NUMERICS = ("jax_threefry_partitionable", "jax_default_matmul_precision")
"""JAX's settings a user may export (``JAX_THREEFRY_PARTITIONABLE=0``, ...) that change a step's draws
or its matrix products: a resume under another one failed its checks naming none. (The default PRNG,
recorded once, moves nothing: a run's keys are of `step.PRNG_IMPL` whatever it says.)"""


def jax_numerics() -> str:
    """`JAX_NUMERICS` as this process has them, e.g. "jax_default_matmul_precision=None ..."."""
    import jax

    return " ".join(f"{name}={getattr(jax.config, name)}" for name in JAX_NUMERICS)


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
"""The XLA flag that simulates CPU devices."""


def xla_flags() -> str:
    """``$XLA_FLAGS`` as a step's numbers see it: sorted, without the simulated CPU device count (which the
    resume compares as a device count: `--train.virtual-shards`) and the flags that only write XLA's
    programs out (``--xla_dump_to`` and its kind: a resume with them was "another machine", its loss
    compared to a tolerance); "none" where empty."""
    moves = (f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(NUMBERS_UNMOVED))
    return " ".join(sorted(moves)) or "none"


#: Flags that change no number a step computes: the simulated device count, dumps of the programs.
NUMBERS_UNMOVED = (DEVICE_COUNT_FLAG, "--xla_dump_")


def lapack_kernels() -> str:
    """The kernels of the LAPACK that JAX's CPU linear algebra calls (the effective rank's SVD): jaxlib
    loads scipy's, and scipy's OpenBLAS picks kernels for the host's core when it loads (or as
    ``$OPENBLAS_CORETYPE`` says), e.g. "Haswell" or "SkylakeX". Two CPUs with one model name and one
    instruction set can get other kernels, and other last bits: two AVX-512 EPYCs computed a step bit for
    bit alike but for the ranks, the one with OpenBLAS's Haswell kernels (its bits reproduced by forcing
    them on the other), the other with SkylakeX's. "unknown" where the library names no core (another
    BLAS than OpenBLAS)."""
    import scipy.linalg.cython_lapack  # noqa: F401  (the library jaxlib's LAPACK calls; loads it if not yet)
    from threadpoolctl import threadpool_info

    scipys = [i for i in threadpool_info() if "scipy" in i.get("filepath", "")]
    return (scipys[0].get("architecture") if scipys else None) or "unknown"
