"""The bits of two training steps, as sha256 digests: `test_objectives.py` compares them with those the
code before objectives became units (commit `PRE_REGISTRY`) computes on the same kind of machine (another
CPU compiles other kernels): ``fixtures/step_digests.json`` keeps one recording per kind CI has run on,
and on another kind `by_the_old_code` computes them, from that commit out of git's history. Run as a
script, in the suite's XLA settings, from a copy of that commit's tree with this file copied in, it adds
or replaces this machine's recording: ``python tests/step_digests.py tests/fixtures/step_digests.json``
(with ``BIRDJEPA_TEST_XLA_DEFAULT=1``, the recording at XLA's default level). The outputs' names are
the code's, the same on every machine: the fixture keeps them once (``outputs``), and each recording
its digests in that order (~50 KB a recording, against ~210 KB with the names in each).
A digest that moves means a step's arithmetic, its outputs or its recording changed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

CONFIGS = {
    # Everything the LeJEPA step draws or adds: dropout, augmentation, local crops, the span term, an
    # accumulation step then an update (the second is recorded, as `birdjepa trace` records it).
    "lejepa": ["--model.dropout", "0.1", "--model.drop-path", "0.1", "--augment.gain-db", "3",
               "--objective.lejepa.local-views", "2", "--objective.lejepa.span-weight", "0.5",
               "--model.predictor-depth", "1", "--optim.grad-accum", "2"],
    "supervised": ["--objective.kind", "supervised", "--optim.grad-accum", "2"],
    "lejepa_virtual_shards": ["--train.virtual-shards", "2", "--objective.lejepa.local-views", "2",
                              "--objective.lejepa.span-weight", "0.5", "--model.predictor-depth", "1"],
}  # fmt: skip


def digest(value: Any) -> str:
    a = np.asarray(value)
    return hashlib.sha256(f"{a.dtype}{a.shape}".encode() + a.tobytes()).hexdigest()[:16]


def step_digests(args: list[str]) -> dict[str, str]:
    """``{output name: digest}`` of two steps of ``args``'s tiny model (batch 4, random batches)."""
    import jax
    import tyro

    from birdjepa.config import PretrainConfig
    from birdjepa.train.compiled import compiled
    from birdjepa.train.recording import leaves
    from birdjepa.train.segment import fresh_state, model_config
    from birdjepa.train.step import StepConfig

    cfg = tyro.cli(PretrainConfig, args=["--model.preset", "tiny", "--data.batch-size", "4", *args])
    model_cfg = model_config(cfg, 4)
    fns = compiled(StepConfig.of(cfg, model_cfg), cfg.optim, 10)
    state = fns.place(fresh_state(cfg, model_cfg, fns.tx))
    params, opt_state = state.params, state.opt_state
    rng = np.random.default_rng(0)
    out: dict[str, str] = {}
    for step in range(2):
        shape = (4, cfg.data.n_views, cfg.model.n_frames, cfg.model.n_mels)
        batch = fns.on_device({
            "spectrogram": rng.normal(size=shape).astype(np.float32),
            "label": rng.integers(-1, 4, size=4),
        })  # fmt: skip
        inputs = (params, opt_state, batch, jax.random.key(step), step == 1)
        recorded = step == 1 and hasattr(fns.train_step, "recorded")
        res, record = fns.train_step.recorded(*inputs) if recorded else (fns.train_step(*inputs), None)
        params, opt_state = res[0], res[1]
        out.update({f"{step}{name}": digest(v) for name, v in leaves(res)})
        if record is not None:
            for (stage, name, _, _), summary in zip(fns.train_step.computed, record, strict=True):
                out.update({f"{step}/trace/{stage}/{name}/{k}": digest(v) for k, v in summary.items()})
    return out


MONITOR_SUMS = ("grad_norm", "grad_mean_abs", "param_norm", "update_norm", "update_ratio")
UPDATED = (".mu[", ".nu[", "['train/update_norm']", "/trace/updates/", "/trace/gradients_clipped/")
"""What an update makes of its clipped gradients besides the parameters (output ``[0]``): AdamW's
moments, the update's norm and the recorded updates (and clipped gradients)."""


REDEFINED = ("train/grad_norm",)
"""Metrics revision 4 gave another meaning (the objective's gradients' norm, the probe's apart)."""
ADDED = ("train/probe_grad_norm",)
"""Metrics added since `PRE_REGISTRY` (revision 4)."""


def metric(key: str) -> str | None:
    """The metric an output key names (``"0[2]['train/loss']"`` -> ``"train/loss"``), else None."""
    return key[6:-2] if key[1:6] == "[2]['" else None


def revised(key: str, args: list[str]) -> bool:
    """Whether a declared revision of the step (`birdjepa.train.revisions`) moved output ``key`` of
    ``args``'s two steps since `PRE_REGISTRY`: the update monitor's float sums (revision 2, one pass per
    parameter; their values are held to float64 sums in test_update_monitor.py) and, from the first
    update on, what the update makes of the clipped gradients, and then everything the next step
    computes from them (revision 3, the online probe clipped apart; test_optim.py holds what it
    changed), and the gradients' norm (revision 4: `REDEFINED`). The first step's forward pass, loss and
    gradients, and an accumulation step whole, stay."""
    step, first_update = int(key[0]), 1 if "--optim.grad-accum" in args else 0
    if key in {f"1[3]['{k}']" for k in MONITOR_SUMS} or metric(key) in REDEFINED:
        return True
    return step > first_update or (
        step == first_update and (key[1:].startswith("[0]") or any(u in key for u in UPDATED))
    )


PRE_REGISTRY = "c33e628"
"""The last commit before objectives became units (aae13d3 was that change)."""
FIXTURE = Path(__file__).parent / "fixtures" / "step_digests.json"


def recorded() -> dict[str, dict[str, str]] | None:
    """This kind of machine's recording in the fixture (``{config: {output: digest}}``), or None."""
    fixture = json.loads(FIXTURE.read_text())
    here = [r["digests"] for r in fixture["recordings"] if r["machine"] == machine()]
    if not here:
        return None
    return named(fixture, here[0])


def named(fixture: dict[str, Any], digests: dict[str, list[str]]) -> dict[str, dict[str, str]]:
    """A recording's digests by output name (``fixture["outputs"]`` holds the names, in their order)."""
    return {name: dict(zip(fixture["outputs"][name], d, strict=True)) for name, d in digests.items()}


def record(path: Path, found: dict[str, dict[str, str]]) -> None:
    """Add ``found`` (this machine's digests) to the fixture at ``path``, replacing this kind's recording.
    Every recording shares the fixture's output names: other names mean the code that computed them is
    not the one the others came from, so this refuses."""
    fixture = json.loads(path.read_text()) if path.exists() else {"outputs": {}, "recordings": []}
    outputs = {name: sorted(d) for name, d in found.items()}
    if fixture["recordings"] and fixture["outputs"] != outputs:
        raise SystemExit(f"{path}'s recordings name other outputs than this code's: not {PRE_REGISTRY}'s?")
    recordings = [r for r in fixture["recordings"] if r["machine"] != machine()]
    digests = {name: [d[k] for k in outputs[name]] for name, d in found.items()}
    recordings.append({"machine": machine(), "digests": digests})
    path.write_text(json.dumps({"outputs": outputs, "recordings": recordings}, indent=1) + "\n")


def by_the_old_code(work: Path) -> dict[str, dict[str, str]]:
    """The digests `PRE_REGISTRY`'s code computes here: its ``src`` and ``tests`` out of git's history
    into ``work``, with this file and the built Rust extension (the step reads no shard), run in a
    process of their own with this process's XLA settings (~35 s). Raises where the checkout has no
    history or that code cannot run."""
    repo = Path(__file__).resolve().parents[1]
    git = subprocess.run(
        ["git", "-C", str(repo), "archive", PRE_REGISTRY, "src", "tests"], capture_output=True
    )
    if git.returncode != 0:
        why = git.stderr.decode()[-500:]
        raise RuntimeError(f"no recording for {machine()}, and no commit {PRE_REGISTRY} in this "
                           f"checkout's history to compute one (a shallow clone?): {why}")  # fmt: skip
    archive = git.stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(work, filter="data")
    shutil.copy(__file__, work / "tests" / "step_digests.py")
    for built in (repo / "src" / "birdjepa").glob("_rs*.so"):
        shutil.copy(built, work / "src" / "birdjepa" / built.name)
    out = work / "digests.json"
    env = {**os.environ, "PYTHONPATH": str(work / "src")}
    done = subprocess.run([sys.executable, str(work / "tests" / "step_digests.py"), str(out)],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{PRE_REGISTRY}'s code could not compute its digests:\n{done.stderr[-3000:]}")
    fixture = json.loads(out.read_text())
    (found,) = fixture["recordings"]
    if found["machine"] != machine():  # the same CPU, jaxlib, pool and flags, or the comparison means nothing
        raise RuntimeError(f"{PRE_REGISTRY}'s code ran as {found['machine']}, this process is {machine()}")
    return named(fixture, found["digests"])


def machine() -> dict[str, str]:
    """What the digests depend on besides the code: the CPU, jaxlib, the thread pool, the XLA flags and the
    LAPACK kernels (the ranks' SVD; `birdjepa.train.determinism.lapack_kernels`, asked here of the library
    itself: `PRE_REGISTRY`'s code, which runs this file in `by_the_old_code`, predates that function)."""
    import jaxlib
    import scipy.linalg.cython_lapack  # noqa: F401  (jaxlib's LAPACK)
    from threadpoolctl import threadpool_info

    from birdjepa.train.determinism import cpu_model

    flags = os.environ.get("XLA_FLAGS", "")
    lapack = [i.get("architecture") for i in threadpool_info() if "scipy" in i.get("filepath", "")]
    return {"cpu": cpu_model(), "jaxlib": jaxlib.__version__, "threads": os.environ.get("PJRT_NPROC", ""),
            "xla_flags": " ".join(sorted(set(flags.split()))),
            "lapack": (lapack or ["unknown"])[0]}  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    import conftest  # noqa: F401  (the suite's XLA settings)

    record(Path(sys.argv[1]), {name: step_digests(args) for name, args in CONFIGS.items()})
