"""`birdjepa diff-trace A B`: two traces laid side by side, stage by stage, in computation order.

Tensors are matched by ``stage/name``, so traces of different architectures or objectives compare
what they share and list the rest. A tensor differs when its bits differ; the difference is *real*
only where it exceeds the noise floor that either trace measured (``--repeat``: what differs between
executions of the same step on the same inputs; 0 on CPU).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from birdjepa.divergence.region import describe, module_of_param
from birdjepa.divergence.trace_file import Entry, Trace
from birdjepa.resume.checks import config_diff


@dataclasses.dataclass(frozen=True)
class TensorDiff:
    stage: str
    name: str
    shape: tuple[tuple[int, ...], tuple[int, ...]]
    max_abs: float
    max_rel: float
    index: tuple[int, ...] | None
    """Where the largest difference is (None when the shapes or dtypes differ)."""
    values: tuple[Any, Any] | None
    floor: float
    """The noise floor of this tensor (the larger of the two traces')."""
    rel_to_scale: float = math.inf
    """``max_abs`` over the tensor's largest magnitude: how many of its last bits moved, whatever the
    size of the element where it happened (an elementwise relative difference near 0 says little)."""
    exact: bool = True
    """False where one trace holds only the tensor's digest and statistics: ``max_abs`` is then the
    largest difference of its min, max and mean, a lower bound (``--keep`` it for the values)."""

    @property
    def bits_only(self) -> bool:
        """Equal as numbers, other bits: a zero's sign, a NaN's payload (another order of the same
        operations can give -0.0 for 0.0). No noise floor is needed to call it below one."""
        return self.exact and self.index is not None and self.max_abs == 0.0

    @property
    def real(self) -> bool:
        if not self.exact:  # the size is unknown: real unless the tensor varies between executions
            return self.floor == 0.0
        return not self.max_abs <= self.floor  # NaN and inf are real

    def line(self) -> str:
        if not self.exact:
            noisy = "; it varies between executions" if self.floor else ""
            return (f"{self.stage}/{self.name}: digest differs (shape {self.shape[0]}; min, max, mean, norm "
                    f"{_stats(self.values)}; max abs at least {self.max_abs:.3g}{noisy}; --keep it for "
                    "the values)")  # fmt: skip
        if self.index is None:
            return f"{self.stage}/{self.name}: shape or dtype {self.shape[0]} vs {self.shape[1]}"
        at = f"[{', '.join(map(str, self.index))}]" if self.index else ""
        a, b = self.values or (None, None)
        floor = f", noise floor {self.floor:.3g}" if self.floor else ""
        return (
            f"{self.stage}/{self.name}{at}: {_fmt(a)} vs {_fmt(b)} (shape {self.shape[0]}, max abs "
            f"{self.max_abs:.3g}, max rel {self.max_rel:.3g}{floor})"
        )


@dataclasses.dataclass(frozen=True)
class StageDiff:
    stage: str
    compared: int
    differing: list[TensorDiff]
    only_a: list[str]
    only_b: list[str]

    @property
    def identical(self) -> bool:
        return not self.differing and not self.only_a and not self.only_b

    def line(self) -> str:
        if not self.compared:
            side = "A" if self.only_a else "B"
            return f"{self.stage:<18} present in {side} only ({len(self.only_a) or len(self.only_b)} tensors)"
        if not self.differing and (self.only_a or self.only_b):  # not "identical": the stage is not
            extra = _only(self.only_a, self.only_b)
            return f"{self.stage:<18} the {self.compared} compared tensors identical{extra}"
        if not self.differing:
            return f"{self.stage:<18} identical ({self.compared} tensors)"
        real = [d for d in self.differing if d.real]
        # By size alone: a digest's is a lower bound, so one larger than every known difference is the
        # worst, and one smaller is not (digests first named a tensor 4,000 times closer than the one whose
        # values, kept whole, differed most).
        worst = max(real or self.differing, key=lambda d: (d.max_abs, d.exact))
        if real:
            kind = "differs"
        elif all(d.bits_only for d in self.differing):
            kind = "differs in bits only (a zero's sign, a NaN's payload)"
        else:
            kind = "differs at the noise floor"
        bound = "max abs" if worst.exact else "max abs at least"
        return (
            f"{self.stage:<18} {kind}: {len(self.differing)} of {self.compared} tensors"
            f"{_only(self.only_a, self.only_b)}; the worst {worst.name}, {bound} {worst.max_abs:.3g}"
        )


@dataclasses.dataclass(frozen=True)
class TraceDiff:
    config: tuple[list[str], list[str]]
    """(harmless, breaking) config differences, as ``key:a->b``."""
    steps: tuple[int, int]
    stages: list[StageDiff]
    region: str | None = None
    """Where in the code a first difference in the forward pass arose (`birdjepa.divergence.region`)."""

    @property
    def first(self) -> TensorDiff | None:
        """The first real difference in computation order (or, if none is real, the first at all)."""
        diffs = [d for s in self.stages for d in s.differing]
        return next((d for d in diffs if d.real), diffs[0] if diffs else None)

    @property
    def identical(self) -> bool:
        return all(s.identical for s in self.stages) and not self.config[1]

    def report(self) -> str:
        harmless, breaking = self.config
        lines = [f"steps: A {self.steps[0]}, B {self.steps[1]}"]
        lines.append(
            "config: " + ("; ".join(breaking) if breaking else "the same")
            + (f" (also harmless: {'; '.join(harmless)})" if harmless else "")
        )  # fmt: skip
        first = self.first
        if first is None:
            only = [s.stage for s in self.stages if not s.identical]
            lines.append("first difference: none" + (f" (tensors in one trace only: {only})" if only else ""))
        else:
            lines.append(f"first difference: stage {first.stage}, {first.line()}")
            if self.region:
                lines.append(f"where: {self.region}")
        lines.append("")
        lines.extend(s.line() for s in self.stages)
        return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.8g}"
    return repr(v)


def _stats(values: tuple[Any, Any] | None) -> str:
    a, b = values or ((), ())
    return ", ".join(f"{_fmt(x)} vs {_fmt(y)}" for x, y in zip(a[:4], b[:4], strict=True))


def _only(a: list[str], b: list[str]) -> str:
    parts = [f"{len(a)} in A only" if a else "", f"{len(b)} in B only" if b else ""]
    return "".join(f", {p}" for p in parts if p)


def tensor_diff(x: Entry, y: Entry, floor: float) -> TensorDiff | None:
    """How ``y`` differs from ``x`` (None: the same bits): exactly where both were kept whole, else
    from their digests and statistics."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return TensorDiff(x.stage, x.name, (x.shape, y.shape), math.inf, math.inf, None, None, floor)
    if x.digest == y.digest:
        return None
    if x.array is None or y.array is None:
        bound = max(abs(p - q) for p, q in zip(x.stats[:3], y.stats[:3], strict=True))
        bound = math.inf if math.isnan(bound) else bound
        return TensorDiff(x.stage, x.name, (x.shape, y.shape), bound, math.inf, None, (x.stats, y.stats),
                          floor, math.inf, exact=False)  # fmt: skip
    a, b = x.array, y.array
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):  # an infinity both hold is no difference (inf - inf: NaN, then inf)
        d = np.where(fa == fb, 0.0, np.abs(fa - fb))
    d = np.where(np.isnan(fa) & np.isnan(fb), 0.0, np.where(np.isnan(d), np.inf, d))
    flat = int(np.argmax(d)) if d.size else 0
    index = tuple(int(i) for i in np.unravel_index(flat, a.shape)) if a.shape else ()
    scale = np.maximum(np.abs(fa), np.abs(fb))
    rel = np.where(d == 0, 0.0, d / np.where(scale > 0, scale, 1e-300))
    max_abs = float(d.reshape(-1)[flat]) if d.size else 0.0
    if max_abs == 0.0:  # only the bits differ (-0.0 vs 0.0, or NaN payloads)
        max_abs = 0.0
    top = float(np.nanmax(scale)) if scale.size and not np.isnan(scale).all() else 0.0
    return TensorDiff(x.stage, x.name, (a.shape, b.shape), max_abs, float(np.max(rel)) if rel.size else 0.0,
                      index, (a.reshape(-1)[flat].item(), b.reshape(-1)[flat].item()), floor,
                      max_abs / top if top > 0 else math.inf)  # fmt: skip


def diff_traces(a: Trace, b: Trace) -> TraceDiff:
    """Stage by stage in A's computation order (then the stages only B has)."""
    noise: dict[str, float] = {}
    for t in (a, b):  # None: it varied, by how much was not recorded
        for k, v in t.manifest.get("noise", {}).items():
            noise[k] = max(noise.get(k, 0.0), math.inf if v is None else v)
    ea, eb = a.by_key(), b.by_key()
    stages = []
    for stage in dict.fromkeys([*a.stages(), *b.stages()]):
        in_a = [e for e in a.entries if e.stage == stage]
        in_b = [e for e in b.entries if e.stage == stage]
        differing = []
        for x in in_a:
            y = eb.get(x.key)
            if y is not None and (d := tensor_diff(x, y, noise.get(x.key, 0.0))) is not None:
                differing.append(d)
        only_a = [e.name for e in in_a if e.key not in eb]
        only_b = [e.name for e in in_b if e.key not in ea]
        compared = sum(1 for e in in_a if e.key in eb)
        stages.append(StageDiff(stage, compared, differing, only_a, only_b))
    config = config_diff(a.manifest.get("config", {}), b.manifest.get("config", {}))
    d = TraceDiff(config, (a.manifest.get("step", -1), b.manifest.get("step", -1)), stages)
    first = d.first
    if first is not None and first.stage == "forward":
        order = [e.name for e in a.entries if e.stage == "forward"]
        sites = {**b.manifest.get("calls", {}), **a.manifest.get("calls", {})}
        params = [
            module_of_param(t.name)
            for st in stages
            if st.stage == "params_in"
            for t in st.differing
            if t.real
        ]
        d = dataclasses.replace(d, region=describe(order, first.name, sites, params))
    return d
