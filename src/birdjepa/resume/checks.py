"""Resume validation, exact: what the next step will do is recorded at save and re-derived on restore.

At every save the loop records `NextStep` for the step that comes next: the fingerprint of its batch,
its PRNG key, the optimizer update it belongs to and that update's LR, the accumulation progress, the
loss of its batch under the saved parameters, that loss's terms and a digest of each parameter's
gradient (one extra forward and backward pass). After a restore, before the first
update, the loop derives the same `NextStep` from what it restored, and `check_resume` compares the two
field by field (``==``), together with the restored norms, the optimizer-state structure, the dataset
fingerprint and the configuration. Each check gives one ``RESUME_CHECK name=… ok=… expected=… got=…``
line and a ``resume/<name>`` metric (1 ok, 0 failed).

The one tolerance: the loss is compared exactly when the device count and the kind of machine
(`determinism.machine_kind`) are the same as at save. On another device count the data-parallel
reductions run in another order (unless ``--train.virtual-shards`` is set: then the device count
changes nothing), and on another device, CPU or JAX version XLA compiles the step otherwise; then it
is compared to a relative ``LOSS_RTOL_ELSEWHERE`` (by its compute dtype) and the line says why, and the
terms and gradients,
whose bits move there too, are not compared (``next_gradient`` says so).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from birdjepa.config import PretrainConfig, flatten, recorded, to_dict
from birdjepa.data import Batch
from birdjepa.model.config import PRESETS

#: By the step's compute dtype. bfloat16 keeps 8 bits of each activation, and another order of the
#: reductions moves its loss by more: 7.3e-5 from 4 devices to 1 (a helper's run), refused at 1e-5 (exit
#: 65, not requeued). The loss itself is always reduced in float32.
LOSS_RTOL_ELSEWHERE = {"float32": 1e-5, "bfloat16": 1e-3}

#: Every check, in the order they are reported.
CHECKS = (
    "config",
    "dataset",
    "loader_state",
    "next_batch",
    "prng",
    "lr",
    "accumulation",
    "opt_state_structure",
    "param_norms",
    "opt_state_norms",
    "next_loss",
    "next_gradient",
)

#: The ``config`` check's expected value when breaking changes were given with --allow-config-change.
BREAKING_ALLOWED = "breaking_changes_allowed"
#: Config keys that may change across a resume without changing the run: cadences, logging, worker
#: count, run control and the diagnostics. Everything else (batch size, seed, data options, model,
#: objective, optimizer, schedule, steps, PRNG mode) is breaking. The data paths are harmless here
#: because the `dataset` check compares the shards' content fingerprint (data moved to node-local disk
#: is the same data), and so is the audio root, whose files' sizes and times the fingerprint holds (audio
#: copied to node-local disk at each requeue exited 65, and a requeue fails again).
HARMLESS_CONFIG = (
    "run",
    "resume",
    "stop_at_step",
    "log_every",
    "eval_every",
    "eval_linear",
    "ckpt_every",
    "ckpt_keep",
    "ckpt_async",
    "monitor_interval",
    "iid_window",
    "resume_checks",
    "allow_config_change",
    "debug.roundtrip_steps",
    "debug.nonfinite_steps",
    "debug.inject_fault",
    "on_nonfinite",
    "max_skips",
    "data.train",
    "data.eval",
    "data.audio_root",
    "data.n_workers",
    "log.",
)


#: The batch arrays a fingerprint covers: the ones batches had when checkpoints first recorded it, so a
#: checkpoint written before the loader added ``crop_offset`` (which the spectrogram reflects anyway)
#: still matches.
FINGERPRINTED = ("epoch", "index", "label", "shard_id", "spectrogram")


def batch_fingerprint(batch: Batch) -> str:
    """blake2b of a batch's `FINGERPRINTED` arrays (name, dtype, shape and bytes), in name order."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(k for k in batch if k in FINGERPRINTED):
        a = np.ascontiguousarray(batch[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class NextStep:
    """What step ``step`` will do, derived from the state that precedes it."""

    step: int
    batch: str
    """`batch_fingerprint` of the batch the loader yields for it."""
    key: list[int]
    """``jax.random.key_data`` of its PRNG key."""
    update: int
    """Optimizer updates applied before it (the optimizer's step count)."""
    lr: float
    """``schedule(update)``: the LR its update will apply."""
    accumulation: int
    """Micro-batches accumulated towards that update."""
    loss: float
    """Its batch's loss under the parameters before it, with its key."""
    n_devices: int
    terms: dict[str, float] | None = None
    """The scalar terms of its loss (`birdjepa.train.step.scalar_terms`); None in a checkpoint written
    before they were recorded."""
    gradients: dict[str, str] | None = None
    """Each parameter's path -> the hex digest of its gradient, in flatten order; None as ``terms``."""

    @classmethod
    def of(
        cls,
        step: int,
        batch: Batch,
        key: jax.Array,
        update: int,
        lr: float,
        accumulation: int,
        loss: float,
        n_devices: int,
        terms: dict[str, float] | None = None,
        gradients: dict[str, str] | None = None,
    ) -> NextStep:
        key_data = np.asarray(jax.random.key_data(key)).ravel().tolist()
        fingerprint = batch_fingerprint(batch)
        return cls(step, fingerprint, key_data, update, lr, accumulation, loss, n_devices, terms, gradients)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NextStep:
        return cls(**{f.name: d[f.name] if f.default is dataclasses.MISSING else d.get(f.name, f.default)
                      for f in dataclasses.fields(cls)})  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    expected: str
    got: str

    def line(self) -> str:
        expected, got = _text(self.expected), _text(self.got)
        return f"RESUME_CHECK name={self.name} ok={self.ok} expected={expected} got={got}"


def _text(v: Any) -> str:
    """A value for a RESUME_CHECK line: floats in round-trip form, anything with spaces quoted."""
    if isinstance(v, (list, tuple)):
        s = ",".join(_text(x) for x in v)
    else:
        s = repr(v) if isinstance(v, float) else str(v)
    return json.dumps(s) if (not s or any(c.isspace() for c in s)) else s


def is_harmless(key: str) -> bool:
    return any(key == h or (h.endswith(".") and key.startswith(h)) for h in HARMLESS_CONFIG)


#: Breaking options no --allow-config-change lets change within a run: those that lay out the data stream
#: (the loader refuses its saved position) or the step keys, and the accumulation the schedule counts.
FIXED_IN_A_RUN = ("seed", "prng", "optim.grad_accum", "data.")


def fixed_in_a_run(change: str) -> bool:
    """Whether a breaking change (``key:saved->now``, `config_diff`'s) is one of `FIXED_IN_A_RUN`'s."""
    key = change.split(":", 1)[0]
    return any(key == f or (f.endswith(".") and key.startswith(f)) for f in FIXED_IN_A_RUN)


def config_diff(saved: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(harmless, breaking)`` changes between two `config.to_dict` trees, as ``key:saved->now``. An
    option that one config lacks and the other holds at its default is harmless: a config written
    before the option existed ran with the behaviour its default keeps."""
    a, b = _preset_filled(recorded(saved)), _preset_filled(recorded(now))
    defaults = flatten(to_dict(PretrainConfig()))
    harmless, breaking = [], []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            change = f"{key}:{_option_text(a, key)}->{_option_text(b, key)}"
            # The side that holds it at its default (a.get of the side that lacks it is None, which
            # matched every option whose default is None: --debug.plant given at a resume passed).
            held = a[key] if key in a else b[key]
            new_at_default = (key not in a or key not in b) and defaults.get(key, "<none>") == held
            (harmless if is_harmless(key) or new_at_default else breaking).append(change)
    return harmless, breaking


def _preset_filled(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with each model option left at None (the preset's) holding the preset's value: a
    resume given the preset's own value (--model.depth 2 on a tiny run) was refused as depth None->2."""
    for name, value in PRESETS.get(config.get("model.preset"), {}).items():
        if f"model.{name}" in config and config[f"model.{name}"] is None:
            config[f"model.{name}"] = value
    return config


def _option_text(config: Mapping[str, Any], key: str) -> str:
    """An option's value in a change: lists without spaces, text as it is (every space was taken out,
    and the lines named paths that do not exist; `CheckResult.line` quotes text with spaces)."""
    if key not in config:
        return "<absent>"
    v = config[key]
    return json.dumps(v, separators=(",", ":")) if isinstance(v, (list, dict)) else str(v)


def tree_spec(tree: Any) -> list[tuple[str, tuple[int, ...], str]]:
    """(path, shape, dtype) of every leaf: the structure a restored tree must have."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [(jax.tree_util.keystr(p), tuple(np.shape(x)), str(np.dtype(x.dtype))) for p, x in leaves]


def _norm_check(name: str, prefix: str, saved: Mapping[str, float], now: Mapping[str, float]) -> CheckResult:
    keys = sorted(k for k in set(saved) | set(now) if k.split("/")[0] == prefix)
    bad = [k for k in keys if saved.get(k) != now.get(k)]
    if not bad:
        return CheckResult(name, True, _text(saved.get(prefix)), _text(now.get(prefix)))
    k = bad[0]
    more = f"(+{len(bad) - 1}_more)" if len(bad) > 1 else ""
    return CheckResult(name, False, f"{k}={_text(saved.get(k))}", f"{k}={_text(now.get(k))}{more}")


def dataset_check(meta: Mapping[str, Any], dataset: str, shards: Mapping[str, str] | None) -> CheckResult:
    """The data the run resumes on is the data it trained on: the fingerprint (names, sizes, the ends of
    each shard) and, where the checkpoint recorded them (`Loader.shard_digests`), each shard's content
    but the audio's bytes and its vocab.json, naming the shards that changed: one relabelled at the same
    size (a second `prepare`) kept the fingerprint and passed every check, the run then not exact."""
    saved, saved_shards = meta["dataset_fingerprint"], meta.get("dataset_shards")
    changed = []
    if saved_shards is not None and shards is not None:
        # Shards of one file name in several folders: an older birdjepa kept one digest for them, under
        # the bare name (now each is named by its folder). Those are compared by the fingerprint, as then.
        names = Counter(n.rsplit("/", 1)[-1] for n in shards)
        older = {n for n in saved_shards if "/" not in n and names[n] > 1}
        both = {*saved_shards, *shards} - older
        changed = sorted(
            n for n in both if n.rsplit("/", 1)[-1] not in older and saved_shards.get(n) != shards.get(n)
        )
        # A shard added or removed was "changed" as one whose rows were rewritten.
        changed = [f"{n}(added)" if n not in saved_shards else f"{n}(removed)" if n not in shards else n
                   for n in changed]  # fmt: skip
    if not changed:
        return CheckResult("dataset", dataset == saved, saved, dataset)
    more = f"(+{len(changed) - 3}_more)" if len(changed) > 3 else ""
    return CheckResult("dataset", False, saved, f"{dataset}+changed_shards:{','.join(changed[:3])}{more}")


def check_resume(
    meta: Mapping[str, Any],
    now: NextStep,
    *,
    config: Mapping[str, Any],
    dataset: str,
    shards: Mapping[str, str] | None = None,
    loader_error: str | None,
    norms: Mapping[str, float],
    opt_state_spec: list,
    expected_opt_state_spec: list,
    grad_accum: int,
    allow_config_change: bool,
    skipped: int = 0,
    machine_changed: Sequence[str] = (),
) -> list[CheckResult]:
    """Compare the restored run (``now`` and the keyword arguments) with checkpoint ``meta``.

    ``meta["next_step"]`` is the `NextStep` recorded at save; ``norms`` are `checkpoint.state_norms` of
    the state the loop will train on; ``loader_error`` is why the loader refused the saved state (None if
    it took it); ``skipped``: micro-steps not applied so far (``--on-nonfinite skip``);
    ``machine_changed``: what of `machine_kind` differs from the save (`machine_changes`). Breaking config
    changes fail the ``config`` check unless ``allow_config_change``.
    """
    rec = NextStep.from_json(meta["next_step"])
    out = []

    harmless, breaking = config_diff(meta["config"], config)
    if breaking and allow_config_change:
        out.append(CheckResult("config", True, BREAKING_ALLOWED, ",".join(breaking)))
    else:
        got = ",".join(breaking) or ("harmless:" + ",".join(harmless) if harmless else "unchanged")
        out.append(CheckResult("config", not breaking, "no_breaking_change", got))

    out.append(dataset_check(meta, dataset, shards))
    out.append(CheckResult("loader_state", loader_error is None, "restored", loader_error or "restored"))
    out.append(CheckResult("next_batch", now.batch == rec.batch, rec.batch, now.batch))
    out.append(CheckResult("prng", now.key == rec.key, _text(rec.key), _text(now.key)))

    # The update step `now.step` belongs to, and the LR the schedule gives it (skipped micro-steps
    # advanced neither the update count nor the accumulation).
    applied = now.step - skipped
    want_update = applied // grad_accum
    # An allowed change of the optimizer or the run length changes the schedule: the LR may differ then.
    schedule_changed = allow_config_change and any(c.startswith(("optim.", "steps:")) for c in breaking)
    lr_ok = now.update == want_update == rec.update and (now.lr == rec.lr or schedule_changed)
    expected_lr = "changed_schedule" if schedule_changed else _text(rec.lr)
    out.append(
        CheckResult(
            "lr", lr_ok, f"update={want_update},lr={expected_lr}", f"update={now.update},lr={_text(now.lr)}"
        )
    )
    want_acc = applied % grad_accum
    acc_ok = now.accumulation == want_acc == rec.accumulation
    out.append(
        CheckResult("accumulation", acc_ok, f"{want_acc}/{grad_accum}", f"{now.accumulation}/{grad_accum}")
    )

    if opt_state_spec == expected_opt_state_spec:
        out.append(CheckResult("opt_state_structure", True, f"{len(opt_state_spec)}_leaves", "same"))
    else:
        diff = [f"{a}!={b}" for a, b in zip(expected_opt_state_spec, opt_state_spec, strict=False) if a != b][
            :1
        ]
        got = f"{len(opt_state_spec)}_leaves:" + ",".join(diff).replace(" ", "")
        out.append(CheckResult("opt_state_structure", False, f"{len(expected_opt_state_spec)}_leaves", got))

    out.append(_norm_check("param_norms", "param_norm", meta["norms"], norms))
    out.append(_norm_check("opt_state_norms", "opt_state_norm", meta["norms"], norms))

    # With virtual shards (the same V on both sides, else the config check fails) the device count
    # changes nothing: the loss is compared exactly.
    virtual = bool(config.get("train", {}).get("virtual_shards"))
    moved = now.n_devices != rec.n_devices and not virtual
    elsewhere = [f"devices:{rec.n_devices}->{now.n_devices}"] if moved else []
    elsewhere += [f"machine:{'+'.join(machine_changed)}"] if machine_changed else []
    # An allowed change that moves the next step's loss (an objective's weight, the model, the data, the
    # seed; not the optimizer's, which acts after it) failed these two, "fix the cause", and the option
    # allowed nothing: their records are of the old options.
    retrained = [c.split(":")[0] for c in breaking if not c.startswith(("optim.", "steps:"))]
    if allow_config_change and retrained:
        why = f"not_compared(config_changed:{','.join(retrained)})"
        out += [
            CheckResult("next_loss", True, why, _text(now.loss)),
            CheckResult("next_gradient", True, why, "-"),
        ]
        return out
    if not elsewhere:
        loss_ok = _same(now.loss, rec.loss)
        expected = _text(rec.loss)
    else:
        # A NaN or inf loss (--on-nonfinite skip) is the same one, or another (inf's tolerance is inf).
        rtol = LOSS_RTOL_ELSEWHERE[config.get("model", {}).get("dtype", "float32")]
        close = math.isfinite(rec.loss) and abs(now.loss - rec.loss) <= rtol * abs(rec.loss)
        loss_ok = close or _same(now.loss, rec.loss)
        expected = f"{_text(rec.loss)}(rtol={rtol:g},{','.join(elsewhere)})"
    out.append(CheckResult("next_loss", loss_ok, expected, _text(now.loss)))
    out.append(_gradient_check(rec, now, elsewhere))
    assert [c.name for c in out] == list(CHECKS)
    return out


def _gradient_check(rec: NextStep, now: NextStep, elsewhere: Sequence[str]) -> CheckResult:
    """The next step's loss terms and each parameter's gradient digest, exact where the loss is; not
    compared where the loss has its tolerance (the bits move there) or the checkpoint has no record."""
    name, counted = "next_gradient", f"{len(now.terms or {})}_terms,{len(now.gradients or {})}_gradients"
    if rec.terms is None or rec.gradients is None:  # and the resume derived the loss alone, as recorded
        return CheckResult(name, True, "unrecorded", "not_derived")
    if elsewhere:
        return CheckResult(name, True, f"not_compared({','.join(elsewhere)})", counted)
    now_terms, now_grads = now.terms or {}, now.gradients or {}
    bad = [(k, _text(v), _text(now_terms.get(k, "absent"))) for k, v in rec.terms.items()
           if not _same(v, now_terms.get(k))]  # fmt: skip
    bad += [(f"gradient[{k}]", v, now_grads.get(k, "absent")) for k, v in rec.gradients.items()
            if v != now_grads.get(k)]  # fmt: skip
    extra = [k for k in now_terms if k not in rec.terms] + [k for k in now_grads if k not in rec.gradients]
    bad += [(k, "absent", "present") for k in extra]
    if not bad:
        return CheckResult(name, True, f"{len(rec.terms)}_terms,{len(rec.gradients)}_gradients", "same")
    k, want, got = bad[0]
    more = f"(+{len(bad) - 1}_more)" if len(bad) > 1 else ""
    return CheckResult(name, False, f"{k}={want}", f"{k}={got}{more}")


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def machine_changes(saved: Mapping[str, str] | None, now: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """What of `determinism.machine_kind` differs between the save and now: {name: (saved, now)}. Only
    what the checkpoint recorded is compared (one written before a field was recorded has nothing to
    compare it with), but for the CPU thread pool: a CPU checkpoint written before it was recorded
    says ``unrecorded``: its pool followed the core and device counts then, and another pool moves the
    last bits."""
    if not saved:
        return {}
    changed = {k: (saved[k], now.get(k, "?")) for k in sorted(saved) if saved[k] != now.get(k)}
    if "jax_config" in changed and "jax_config" in now:  # a setting recorded then, no longer: not compared
        was, is_ = (
            dict(p.split("=", 1) for p in text.split()) for text in (saved["jax_config"], now["jax_config"])
        )
        if all(was.get(name, value) == value for name, value in is_.items()):
            del changed["jax_config"]
    if "cpu_threads" in now and "cpu_threads" not in saved:
        changed["cpu_threads"] = ("unrecorded", now["cpu_threads"])
    return changed


def describe_changes(changes: Mapping[str, tuple[str, str]]) -> str:
    """``machine_changes`` for a line: "device: A -> B; jaxlib: x -> y"."""
    return "; ".join(f"{k}: {was} -> {now}" for k, (was, now) in changes.items())


def metrics(results: list[CheckResult]) -> dict[str, float]:
    """``resume/<check>`` = 1.0 (ok) or 0.0, and ``resume/failed`` = the number of failed checks."""
    out = {f"resume/{c.name}": float(c.ok) for c in results}
    out["resume/failed"] = float(sum(not c.ok for c in results))
    return out
