"""The pretrain options, checked before anything runs (no JAX here: `birdjepa sweep` imports it).

`check` raises `OptionError` for the first option that cannot work: a ``--run`` that is not a folder
inside ``--log.runs-dir``, a size, count, rate or interval out of its range, a data path that matches
no shard, string labels without their `vocab.json`, or options that cannot work together (views vs
objective, patch vs spectrogram size). Its message is one line that names the option as it is typed,
its value and what is allowed; `birdjepa pretrain` prints it and exits 2 (`exit_codes.USAGE`), before
it opens a run directory.

The loader's own options are checked by the Rust core (`birdjepa._rs.check_loader_options`), which
holds their defaults and ranges; everything else is here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import unicodedata
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Any

from birdjepa import seams
from birdjepa.config import SEED_LIMIT, ConfigError, PretrainConfig, as_recorded, flatten, to_dict
from birdjepa.data import DataError, open_shards, resolve_files
from birdjepa.data.loader import Features, no_shards_match, options_json, read_from
from birdjepa.data.shards import check_same_labels, label_count, labelled_classes
from birdjepa.model.config import PRESETS, ModelConfig
from birdjepa.objectives.options import REGISTRY

MAX_STEPS = 10_000_000  #: The most micro-steps a run may take.
MAX_N_FFT = 2**16  #: The longest FFT of the log-mel features.


class OptionError(ValueError):
    """An option whose value cannot work."""

    def __init__(self, option: str, value: Any, allowed: str) -> None:
        self.option, self.value, self.allowed = option, value, allowed
        super().__init__(f"{flag(option)} {value!r}: {allowed}")


#: The smallest positive float32 (a subnormal); a value below it is 0 in the step.
F32_TINY = 1.401298464324817e-45
#: The smallest learning rate (the probe's too, --optim.lr x --optim.probe-lr-scale) a run takes.
MIN_LR = 1e-12


def flag(option: str) -> str:
    """The command-line spelling of a config field path (``data.batch_size`` -> ``--data.batch-size``);
    an environment variable (``$JAX_ENABLE_X64``) as it is."""
    return option if option.startswith("$") else "--" + option.replace("_", "-")


def _get(cfg: Any, option: str) -> Any:
    for part in option.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _finite(v: Any) -> bool:
    """A float option is a finite number: inf passed every ``>= 0`` rule (a step of ``--augment.pitch-bins
    inf`` was an OverflowError; ``--optim.lr inf`` a non-finite step, blamed on the learning rate)."""
    return not isinstance(v, float) or math.isfinite(v)


_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    ">=0": (lambda v: v >= 0, "must be >= 0 (0 = off)"),
    ">=1": (lambda v: v >= 1, "must be >= 1"),
    ">=2": (lambda v: v >= 2, "must be >= 2"),
    ">0": (lambda v: v > 0, "must be > 0"),
    "[0,1]": (lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    "(0,1)": (lambda v: 0 < v < 1, "must be in (0, 1)"),
}
"""The rules an objective's ``RANGES`` name (`birdjepa.objectives.options.Options`)."""

# (options, predicate, what is allowed); an option left at None means "the default" and is not checked.
_RANGES: list[tuple[tuple[str, ...], Callable[[Any], bool], str]] = [
    (
        ("steps", "log_every", "log.print_every", "ckpt_keep", "iid_window", "optim.grad_accum",
         "model.patch", "model.n_frames", "model.n_mels", "model.n_classes", "model.dim", "model.depth",
         "model.heads", "model.mlp_ratio", "model.patch_freq", "model.proj_hidden", "model.proj_dim"),
        lambda v: v >= 1, "must be >= 1",
    ),
    (
        ("eval_every", "ckpt_every", "monitor_interval", "max_skips", "optim.warmup_steps",
         "model.proj_layers", "model.predictor_depth", "model.registers", "model.layer_scale",
         "train.virtual_shards"),
        lambda v: v >= 0, "must be >= 0 (0 = off)",
    ),
    (("stop_at_step",), lambda v: v >= 0, "must be >= 0"),
    # The LR schedule is a table of one value per update, held in the compiled step (train.optim): 40 MB
    # and 10 s to build at the most; 2^62 never finished building it.
    (("steps", "optim.warmup_steps"), lambda v: v <= MAX_STEPS, f"must be at most {MAX_STEPS:_}"),
    # Each frame is a real FFT of this length for every clip: 10^8 held 9.5 GB, ran on for minutes before
    # a step, and a preemption's SIGTERM could not stop it (handled at a step's end). 2^16: 2 s at 32 kHz.
    (("data.features.n_fft",), lambda v: v <= MAX_N_FFT, f"must be at most {MAX_N_FFT}"),
    # (A run that trained with a seed in [2^32, 2^63) goes on: the check of SEED_LIMIT below.)
    (("seed",), lambda v: 0 <= v < 2**63, "must be in [0, 2^32)"),
    (
        ("optim.lr", "optim.probe_lr_scale", "data.features.std", "model.ln_epsilon"),
        lambda v: v > 0, "must be > 0",
    ),
    (("optim.lr",), lambda v: v < 3e38, "must be a float32 (below 3e38)"),
    # Below float32's smallest number an epsilon is 0; a learning rate far above it already moves no
    # float32 weight (a weight of 0.01's last bit is ~1e-9): 1e-50 trained nothing, exit 0.
    (("model.ln_epsilon",), lambda v: v >= F32_TINY, f"must be at least float32's smallest, {F32_TINY:g}"),
    (("optim.lr",), lambda v: v >= MIN_LR, f"must be at least {MIN_LR:g}: below it no float32 weight moves"),
    # Past these the float32 log-mel is erased (a 1e9 dB offset, a normalisation by 1e-30): a run on
    # zeros that exits 0. No recording's spread or level comes near them.
    (("data.features.std",), lambda v: 1e-6 <= v <= 1e6, "must be in [1e-6, 1e6] (a log-mel's spread)"),
    (("data.features.mean",), lambda v: abs(v) <= 1e6, "must be in [-1e6, 1e6] (a log-mel's mean)"),
    (
        ("augment.gain_db", "augment.tilt_db", "augment.noise_db"),
        lambda v: v <= 100, "must be at most 100 dB",
    ),
    # Each block is traced in Python before the step compiles: 10^6 decoder blocks traced for minutes (no
    # step, no SIGTERM); ViT-22B has 48.
    (("model.depth", "model.predictor_depth", "objective.mae.decoder_depth"), lambda v: v <= 256,
     "must be at most 256 blocks"),
    # Each multiplies a tensor of the step (tokens, local crops, SIGReg's projections at each knot): 10^6
    # local views traced one of 3.3e10 values, past what a jitted argument holds (an OverflowError).
    # LeJEPA's own: 256-1024 directions, 17 knots, a few local views; registers: 4-16.
    (("model.registers",), lambda v: v <= 1024, "must be at most 1024"),
    (("objective.lejepa.local_views",), lambda v: v <= 64, "must be at most 64"),
    (("objective.lejepa.num_directions",), lambda v: v <= 2**16, "must be at most 65536"),
    (("objective.lejepa.num_knots",), lambda v: v <= 1024, "must be at most 1024"),
    # One decode thread each: 10^6 failed to spawn (a panic); 5,000 waited a minute before a step.
    (("data.n_workers",), lambda v: v <= 1024, "must be at most 1024 (0: one per CPU)"),
    # The IID baseline simulates window + 200 batches before step 0: 36 s at 10^5, and 10^14 hung for
    # ever, deaf to SIGTERM (acted on at a step's end).
    (("iid_window",), lambda v: v <= 10_000, "must be at most 10000 batches"),
    (
        ("optim.weight_decay", "optim.clip_norm", "augment.gain_db",
         "augment.tilt_db", "augment.noise_db", "augment.pitch_bins", "augment.stretch"),
        lambda v: v >= 0, "must be >= 0 (0 = off)",
    ),
    (("optim.b1", "optim.b2", "model.dropout", "model.drop_path"), lambda v: 0 <= v < 1, "must be in [0, 1)"),
    (
        ("optim.decay_fraction", "optim.min_lr_ratio", "augment.mix_prob"),
        lambda v: 0 <= v <= 1, "must be in [0, 1]",
    ),
    *(
        (tuple(f"objective.{name}.{f}" for f in fields), *_RULES[rule])
        for name, r in REGISTRY.items()
        for fields, rule in r.options.RANGES
    ),
]  # fmt: skip


def check(cfg: PretrainConfig, *, data: bool = True, saved: Mapping[str, Any] | None = None) -> None:
    """Raise `OptionError` for the first option of ``cfg`` that cannot work; ``data``: also check that
    the data paths match shards and that their labels can be counted. An option the run would never
    read (`unused`) is refused, but where ``saved`` (the flattened config of the checkpoint a run
    resumes) holds the same value: a resumed run that trained with it (before this check) must go on,
    and one given anew on its command line is refused as at a start (it was taken as a harmless or a
    breaking change: a false alarm)."""
    _check_run(cfg)
    for options, ok, allowed in _RANGES:
        for option in options:
            value = _get(cfg, option)
            if value is not None and not _finite(value):
                raise OptionError(option, value, "must be a finite number")
            if value is not None and not ok(value):
                raise OptionError(option, value, allowed)
    if cfg.optim.lr * cfg.optim.probe_lr_scale < MIN_LR:  # the probe trained nothing, exit 0
        why = (
            f"times --optim.lr ({cfg.optim.lr:g}) must be at least {MIN_LR:g}: the probe's weights never move"
        )
        raise OptionError("optim.probe_lr_scale", cfg.optim.probe_lr_scale, why)
    if cfg.optim.grad_accum > cfg.steps:  # --steps counts micro-steps: the run would end before an update
        why = f"must be at most --steps ({cfg.steps}): a step is one micro-batch, an update every N of them"
        raise OptionError("optim.grad_accum", cfg.optim.grad_accum, why)
    if cfg.steps % cfg.optim.grad_accum:  # the last micro-steps would accumulate an update never applied
        k, left = cfg.optim.grad_accum, cfg.steps % cfg.optim.grad_accum
        why = f"must be a multiple of --optim.grad-accum ({k}): the last {left} would accumulate no update"
        raise OptionError("steps", cfg.steps, why)
    if cfg.stop_at_step is not None and cfg.stop_at_step >= cfg.steps:  # the run would end before it
        raise OptionError("stop_at_step", cfg.stop_at_step, f"must be a step in [0, {cfg.steps - 1}]")
    # Past 2^32 the initial weights and step keys of seed mod 2^32 (JAX's keys take 32 bits); a run that
    # trained with such a seed goes on as it was.
    if cfg.seed >= SEED_LIMIT and (saved is None or saved.get("seed") != cfg.seed):
        raise OptionError("seed", cfg.seed, "must be below 2^32: JAX's keys take its low 32 bits, and it "
                          f"would draw seed {cfg.seed % SEED_LIMIT}'s initial weights and steps")  # fmt: skip
    # The optimizer counts updates and the schedule is laid out over steps // grad_accum of them: another
    # accumulation at a resume was refused by the lr check with "fix the cause" even where allowed, and,
    # warned past, trained the rest at the schedule's end (learning rate 0), exit 0.
    trained = as_trained(saved)
    if trained is not None and trained.optim.grad_accum != cfg.optim.grad_accum:
        was = trained.optim.grad_accum
        raise OptionError("optim.grad_accum", cfg.optim.grad_accum, f"cannot change within a run (it trained "
                          f"with {was}: its learning-rate schedule counts updates of {was} steps each, "
                          "--allow-config-change neither); train the change in a new run")  # fmt: skip
    for step in cfg.debug.roundtrip_steps:
        if not 0 <= step < cfg.steps:
            raise OptionError("debug.roundtrip_steps", step, f"each must be a step in [0, {cfg.steps - 1}]")
    for step in cfg.debug.nonfinite_steps:
        if not 0 <= step < cfg.steps:
            raise OptionError("debug.nonfinite_steps", step, f"each must be a step in [0, {cfg.steps - 1}]")
    for kind, option in (("plant", "debug.plant"), ("fault", "debug.inject_fault")):
        name = _get(cfg, option)  # the verification wing's, registered by the command (birdjepa.seams)
        if name is not None and name not in seams.names(kind):
            known = ", ".join(seams.names(kind)) or "none registered (import birdjepa.verify)"
            raise OptionError(option, name, f"must be one of {known}")
        if name is not None and (why := seams.of(kind, name).refuses(cfg)) is not None:
            raise OptionError(option, name, f"would change nothing in this run: {why}")
    if cfg.debug.plant is not None and cfg.model.remat:
        raise OptionError("debug.plant", cfg.debug.plant, "plants change calls inside the blocks, which "
                          "--model.remat runs in a scan: plant in a run with --model.no-remat")  # fmt: skip
    low, high = cfg.augment.mix_db
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise OptionError("augment.mix_db", cfg.augment.mix_db, "must be (low, high), finite, low <= high")
    if cfg.augment.pitch_bins > cfg.model.n_mels:  # its cost grows with it (96 s for a step at 1000)
        why = f"must be at most --model.n-mels ({cfg.model.n_mels}): a larger shift moves every band out"
        raise OptionError("augment.pitch_bins", cfg.augment.pitch_bins, why)
    _check_maps(cfg, trained)
    _check_objective(cfg, trained)
    _check_unused(cfg, saved)
    _check_virtual_shards(cfg, trained)
    if data:
        check_data(cfg)


#: The longest file name most file systems take (ext4, XFS, Lustre, GPFS): a longer one was an OSError.
NAME_MAX = 255
#: The longest path Linux takes, and how far below a run directory a checkpoint's deepest file lies
#: (``checkpoints/N.orbax-checkpoint-tmp-T/state/ocdbt.process_0/d/<32 hex digits>``, with room).
PATH_MAX = 4096
CHECKPOINT_DEPTH = 256


def _utf8(text: str) -> bool:
    """Whether ``text`` is UTF-8 (a name the file system gave in bytes that are not holds surrogates)."""
    try:
        text.encode()
        return True
    except UnicodeEncodeError:
        return False


def _breaks_lines(text: str) -> bool:
    """Whether ``text`` holds a control character (a line break, a tab) or a line or paragraph separator:
    what splits the lines naming it. Not ``str.isprintable``, which refused a no-break space too."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


def not_utf8(what: str) -> str:
    """Why a name that is not UTF-8 is refused: a latin-1 name, or a Python that reads every name as
    ASCII (``LC_ALL=C`` with ``PYTHONUTF8=0``), where good UTF-8 names were blamed."""
    encoding = sys.getfilesystemencoding()
    if encoding.replace("-", "").lower() != "utf8":
        return (f"{what} (this Python reads file names as {encoding}: set LANG=C.UTF-8 or PYTHONUTF8=1, or "
                "rename it)")  # fmt: skip
    return f"{what} (a name in latin-1, say): rename it"


def _check_run(cfg: PretrainConfig) -> None:
    """The run directory is a folder inside ``--log.runs-dir``: ``--run ''`` (or ``.``) would make the runs
    folder itself the run, ``..`` or an absolute name would write outside it. A nested name (``sweep/a``)
    stays inside and is allowed: a sweep config may set its ``run`` to one."""
    name = PurePath(cfg.run)
    if not name.parts or name.is_absolute() or ".." in name.parts:
        allowed = "must be a folder name inside --log.runs-dir (not empty, not absolute, no '..')"
        raise OptionError("run", cfg.run, allowed)
    # A line break split every line naming the run in two; bytes that are no UTF-8 (a latin-1 é) were a
    # UnicodeEncodeError's traceback.
    if not _utf8(cfg.run):
        raise OptionError("run", cfg.run, not_utf8("is not UTF-8"))
    if _breaks_lines(cfg.run):
        raise OptionError("run", cfg.run, "must be printable UTF-8 text (no line break, tab or control "
                          "character)")  # fmt: skip
    # The folder it is in too: trained to its first save, then 127 tracebacks from Orbax ("Unable to cast
    # Python instance of type <class 'str'>") and exit 74 with advice about free space.
    if not _utf8(where := os.path.abspath(cfg.log.runs_dir)):
        raise OptionError("log.runs_dir", str(cfg.log.runs_dir), not_utf8(f"{where!r} is not UTF-8"))
    if _breaks_lines(where):  # a line break split every line naming the run folder, as --run's did
        raise OptionError("log.runs_dir", str(cfg.log.runs_dir), f"{where!r} holds a line break, tab or "
                          "control character")  # fmt: skip
    # Every step trained, then the first save failed ("File name too long", exit 74, "free space"): the
    # checkpoint's deepest files lie ~200 bytes below the run directory.
    path = len(os.fsencode(os.path.abspath(cfg.run_dir)))
    if path > PATH_MAX - CHECKPOINT_DEPTH:
        why = (f"makes a run directory path of {path} bytes: the checkpoints' files below it would pass "
               f"the system's {PATH_MAX}; a shorter --log.runs-dir")  # fmt: skip
        raise OptionError("run", cfg.run, why)
    # Named in the verification's folder too: verify-resume's prefix may take a name past the limit.
    most = NAME_MAX - len("verify-")
    if (longest := max(len(part.encode()) for part in name.parts)) > most:
        raise OptionError("run", cfg.run, f"has a folder name of {longest} bytes: at most {most}")


#: The log floor's range: below float32's smallest normal the log reads it wrongly (1e-40 as -88.0,
#: not -92.1); above 1e-3 quiet bands sit at it (at 1e10 all, exit 0). Kaldi's: float32's epsilon.
LOG_FLOOR = (1.1754943508222875e-38, 1e-3)


def _check_maps(cfg: PretrainConfig, trained: PretrainConfig | None) -> None:
    """The loader's options and the model's, then features every map of which is degenerate (each
    trained without a word), but in a run that trained with them (the checks are younger than it)."""
    f, patch, (low, high) = cfg.data.features, cfg.model.patch, LOG_FLOOR
    new, floor = trained is None or _maps(trained) != _maps(cfg), f.log_floor
    # fmt: off
    if new and floor > 0 and math.isfinite(floor) and not low <= floor <= high:  # before float32 has it
        why = (f"must be in [{low:.6g}, {high:g}]: below float32's smallest normal number its log reads "
               "wrongly, above it quiet bands sit at the floor (a quarter of the demo's values at 1e-3)")
        raise OptionError("data.features.log_floor", floor, why)
    frames, empty = _check_loader(cfg)
    _check_model(cfg)
    if new and f.hop_length > f.win_length:  # audio between two frames that neither reads
        why = f"is above --data.features.win-length {f.win_length}: {1 - f.win_length / f.hop_length:.0%} of "
        raise OptionError("data.features.hop_length", f.hop_length, why + "the audio would be in no frame")
    if new and empty:  # as Kaldi refuses such a filter bank
        why = (f"has {empty} mel band{'s' * (empty > 1)} that no FFT bin falls in "
               f"({f.target_rate / f.n_fft:g} Hz a bin at --data.features.n-fft {f.n_fft}, over {f.f_min:g}-"
               f"{f.f_max or f.target_rate / 2:g} Hz): each is the log floor in every clip; fewer bands, a "
               "larger n_fft or a wider f_min..f_max")
        raise OptionError("data.features.n_mels", f.n_mels, why)
    if new and frames <= f.n_frames - patch:  # a row of patches of zeros in every map
        why = (f"is more than the {frames} log-mel frames a clip gives (--data.features.clip-seconds "
               f"{f.clip_seconds:g}, hop {f.hop_length}): {1 - frames / f.n_frames:.0%} of every map would "
               f"be zeros; --data.features.n-frames and --model.n-frames {-(-frames // patch) * patch}, or "
               "a longer clip")
        raise OptionError("data.features.n_frames", f.n_frames, why)
    # fmt: on


def _maps(cfg: PretrainConfig) -> tuple[Any, ...]:
    f = cfg.data.features  # what `_check_maps` reads
    return (f.target_rate, f.clip_seconds, f.n_fft, f.win_length, f.hop_length, f.n_mels, f.f_min, f.f_max,
            f.log_floor, f.n_frames, cfg.model.patch)  # fmt: skip


def _check_loader(cfg: PretrainConfig) -> tuple[int, int]:
    """The log-mel frames a clip gives and its empty mel bands, where the Rust core takes the loader's
    options; else `OptionError` naming the first it refuses."""
    from birdjepa import _rs

    data = cfg.data.loader_options()
    options = {**data, **cfg.data.features.options()}

    def option(name: str) -> str:
        return f"data.{name}" if name in data else f"data.features.{name}"

    def checked(values: dict[str, Any]) -> tuple[int, int] | tuple[str, str]:
        """The log-mel frames the options give and their empty mel bands, or (option, the Rust core's
        message less its name and value) of the first one it rejects."""
        try:
            return _rs.check_loader_options(options_json(values))
        except ValueError as e:  # "[fbank: ]<name> [(value)] must be ...": the Rust core names the option
            message = str(e).split(": ", 1)[-1] if str(e).startswith(("fbank: ", "clip: ")) else str(e)
            name = message.split()[0]
            return name, re.sub(r"^\([^)]*\) ", "", message.removeprefix(f"{name} "))

    result = checked(options)
    if isinstance(result[0], str):
        name, why = result
        value = options.get(name, "?")
        if isinstance(value, int) and value < 0:  # its type's ">= 0": say the bound it has (batch: >= 1)
            at_zero = checked({**options, name: 0})
            why = at_zero[1] if isinstance(at_zero, tuple) and at_zero[0] == name else "must be >= 0"
        elif why.startswith("x "):  # a product ("batch_size x n_views x ..."): each option, with its value
            product, rule = why.removeprefix("x ").split(" must ", 1)
            names = product.split(" x ")
            terms = " x ".join(f"{flag(option(n))} {options[n]}" for n in names)
            total = math.prod(int(options[n]) for n in (name, *names))
            why = f"x {terms} = {total:,} values a batch, which must {rule.removesuffix(' values a batch')}"
        elif name == "audio_root":  # resolved against the current folder, as the rows' paths under it
            why += read_from(value)
        raise OptionError(option(name), value, why)
    frames, empty = result
    n_frames, patch = cfg.data.features.n_frames, cfg.model.patch
    if frames > n_frames:  # the loader keeps the first n_frames: a 10 s clip trained on its first 5.1 s
        why = (f"gives {frames} log-mel frames, more than --data.features.n-frames ({n_frames}), of which "
               f"the rest would be cut off: a shorter clip, or --data.features.n-frames and --model.n-frames "
               f"{-(-frames // patch) * patch}")  # fmt: skip
        raise OptionError("data.features.clip_seconds", cfg.data.features.clip_seconds, why)
    return frames, empty


def check_encoder(model: ModelConfig, features: Features, batch_size: int) -> None:
    """`OptionError` for the first of an encoder's model, feature and batch options that cannot work
    together (an export's card, hand-edited: a traceback from the loader or the model's first batch)."""
    data = dataclasses.replace(PretrainConfig().data, features=features, batch_size=batch_size)
    cfg = PretrainConfig(model=model, data=data)
    _check_loader(cfg)
    _check_model(cfg)


def _check_model(cfg: PretrainConfig) -> None:
    m = cfg.model
    if m.preset not in PRESETS:
        raise OptionError("model.preset", m.preset, f"must be one of {', '.join(sorted(PRESETS))}")
    r = m.resolved()
    if r.dim % r.heads:
        raise OptionError("model.heads", r.heads, f"must divide --model.dim ({r.dim})")
    if m.rope and (r.dim // r.heads) % 4:
        raise OptionError(
            "model.rope", m.rope, f"needs a head width that 4 divides (it is {r.dim // r.heads})"
        )
    if m.swiglu and 2 * r.mlp_ratio * r.dim // 3 < 1:  # a hidden width of 0: a ZeroDivisionError at init
        raise OptionError("model.swiglu", m.swiglu, "needs 2/3 of --model.mlp-ratio x --model.dim to be >= 1")
    if m.n_frames % m.patch:
        raise OptionError("model.patch", m.patch, f"must divide --model.n-frames ({m.n_frames})")
    if m.n_mels % m.patch_mels:
        raise OptionError("model.patch_freq", m.patch_freq, f"must divide --model.n-mels ({m.n_mels})")
    features = cfg.data.features
    if (features.n_frames, features.n_mels) != (m.n_frames, m.n_mels):
        differs = "n_frames" if features.n_frames != m.n_frames else "n_mels"
        raise OptionError(
            f"model.{differs}", getattr(m, differs),
            f"the model is built for {m.n_frames} x {m.n_mels} spectrograms, the data gives "
            f"{features.n_frames} x {features.n_mels} (--data.features.n-frames, --data.features.n-mels)",
        )  # fmt: skip


def as_trained(saved: Mapping[str, Any] | None) -> PretrainConfig | None:
    """The config the checkpoint a run resumes trained with (``saved``: its recorded config, flattened;
    None: a start), over this birdjepa's defaults (an option added since: its default); None where a
    recorded value no longer fits its option (the resume's own read of it says so)."""
    if saved is None:
        return None
    try:
        return as_recorded(saved, "the checkpoint's config")[0]
    except ConfigError:
        return None


def _check_objective(cfg: PretrainConfig, trained: PretrainConfig | None = None) -> None:
    """The chosen objective's own combinations (`birdjepa.objectives.options.Options.problems`), and no
    option it would ignore: another objective's (``--objective.kind mae --objective.lejepa.lam 0.9``
    trained MAE, exit 0), or a model option it sets itself (supervised's projector is its classifier,
    MAE's has one layer; the class count is the data's), which config.json recorded as given. A
    combination the run resumed (``trained``) trained with goes on: a newer check (a span ratio rounding
    to no span) made the requeue of a run that trained for days exit 2."""
    kind = cfg.objective.kind
    before = list(trained.objective.options.problems(trained)) if trained is not None else []
    for option, value, allowed in cfg.objective.options.problems(cfg):
        if (option, value, allowed) in before:
            continue
        where = "data" if option == "n_views" else f"objective.{kind}"
        raise OptionError(f"{where}.{option}", value, allowed)
    for other in REGISTRY:
        given = getattr(cfg.objective, other)
        default = type(given)()
        for f in dataclasses.fields(given) if other != kind else ():
            if getattr(given, f.name) != getattr(default, f.name):
                why = f"is an option of --objective.kind {other}; this run trains {kind}: leave it out"
                raise OptionError(f"objective.{other}.{f.name}", getattr(given, f.name), why)
    # Built with a class count no option equals: supervised's projector is the data's classes wide, and
    # the default count (10) let --model.proj-dim 10 through, recorded as given.
    built = cfg.objective.options.model(dataclasses.replace(cfg.model, n_classes=-1))
    default_model = ModelConfig()
    for f in dataclasses.fields(cfg.model):
        value = getattr(cfg.model, f.name)
        if value == getattr(default_model, f.name):
            continue
        if f.name == "n_classes":
            raise OptionError(
                "model.n_classes", value, "is the data's class count (its vocab.json): leave it out"
            )
        if getattr(built, f.name) != value:
            raise OptionError(f"model.{f.name}", value, f"the {kind} objective sets it itself: leave it out")


def unused(cfg: PretrainConfig) -> list[tuple[str, Any, str]]:
    """The options given a value other than their default that this run would never read, each with
    why: the objective's (`birdjepa.objectives.options.Options.unused`) and the rest of the recipe's.
    Each trained as if left out (exit 0), while config.json, a sweep's table and the run's name said it
    was set."""
    optim, features, kind = cfg.optim, cfg.data.features, cfg.objective.kind
    hidden = cfg.objective.options.model(cfg.model).proj_layers > 0
    none = "(--model.proj-layers 0)" if kind == "lejepa" else f"(--model.proj-layers 0, as {kind} sets)"
    rules = [  # (option, whether this run reads it, why not)
        ("optim.decay_fraction", optim.schedule == "wsd", "is --optim.schedule wsd's, not cosine's"),
        ("optim.min_lr_ratio", optim.schedule == "cosine" or optim.decay_fraction > 0,
         "is where the decay ends, and --optim.decay-fraction 0 keeps the LR at its peak"),
        ("max_skips", cfg.on_nonfinite == "skip", "counts skipped updates: --on-nonfinite is stop, not skip"),
        *((f"data.features.{axis}_mask_width", getattr(features, f"{axis}_mask_count") > 0,
           f"is each mask's width: --data.features.{axis}-mask-count is 0") for axis in ("time", "freq")),
        ("data.event_column", cfg.data.crop_events, "is read by --data.crop-events, which is off"),
        ("log.wandb_project", cfg.log.wandb != "disabled", "names a wandb project: --log.wandb is disabled"),
        ("eval_linear", cfg.eval_every > 0, "is the last evaluation's linear probe: --eval-every 0 has none"),
        ("augment.mix_db", cfg.augment.mix_prob > 0, "is the mixed-in level: --augment.mix-prob is 0"),
        ("model.drop_path", cfg.model.resolved().depth > 1,
         "is the last block's rate, rising from 0 at the first: one block (--model.depth 1) drops nothing"),
        *((f"model.{name}", hidden, f"is the projector's hidden layers', and it has none {none}")
          for name in ("proj_hidden", "proj_norm")),
    ]  # fmt: skip
    found = list(cfg.objective.options.unused(cfg))
    default = PretrainConfig()
    for option, read, why in rules:
        if not read and _get(cfg, option) != _get(default, option):
            found.append((option, _get(cfg, option), why))
    return found


def _check_unused(cfg: PretrainConfig, saved: Mapping[str, Any] | None) -> None:
    now = flatten(to_dict(cfg)) if saved is not None else {}
    for option, value, why in unused(cfg):
        if saved is not None and option in saved and saved[option] == now.get(option):
            continue  # trained with it
        raise OptionError(option, value, f"{why}: leave it out, or set what reads it")


def _check_virtual_shards(cfg: PretrainConfig, trained: PretrainConfig | None = None) -> None:
    shards = cfg.train.virtual_shards
    if shards and cfg.data.batch_size % shards:
        batch = cfg.data.batch_size
        raise OptionError("train.virtual_shards", shards, f"must divide --data.batch-size ({batch})")
    # The background mix takes the batch's next recording (the clips a loss sees: a virtual shard's): in a
    # batch of one, each clip's own view, a fixed gain of log1p(10^(dB/10)), without a word. A run that
    # trained so (``trained``, before this check) goes on.
    if _mixes_alone(cfg) and not (trained is not None and _mixes_alone(trained)):
        per = f" per virtual shard (--train.virtual-shards {shards})" if shards else ""
        raise OptionError("augment.mix_prob", cfg.augment.mix_prob, f"mixes in another recording of the "
                          f"batch, and a batch of 1{per} has none: a batch of 2 or more, or 0")  # fmt: skip
    if shards and cfg.model.proj_norm == "batch":  # its statistics would be a shard's, not the batch's
        raise OptionError("train.virtual_shards", shards, "needs --model.proj-norm layer (batch statistics)")


def _mixes_alone(cfg: PretrainConfig) -> bool:
    return cfg.augment.mix_prob > 0 and cfg.data.batch_size // (cfg.train.virtual_shards or 1) == 1


def check_data(cfg: PretrainConfig) -> None:
    """The data paths match shard files, the train shards' labels can be counted, and the held-out
    evaluation has held-out shards whose labels name the train split's classes."""
    files: dict[str, list[str]] = {}
    if cfg.data.train is None and cfg.data.crop_events:  # said once the run's folder and log were made
        why = "crops views around a shard's events, and the demo set has none: give --data.train shards"
        raise OptionError("data.crop_events", True, f"{why} that have them")
    for option in ("data.train", "data.eval"):
        value = _get(cfg, option)
        if value is None:  # the demo set, generated on first use
            continue
        if not _utf8(value):  # pyarrow's UnicodeEncodeError, after the run directory was made
            raise OptionError(option, value, not_utf8("is not UTF-8"))
        try:
            files[option] = resolve_files(value)
        except DataError as e:
            raise OptionError(option, value, str(e)) from None
        if (foreign := next((f for f in files[option] if not _utf8(f)), None)) is not None:
            raise OptionError(option, value, not_utf8(f"{foreign!r} is not a UTF-8 name"))
        missing = [f for f in files[option] if not os.path.isfile(f)]
        if missing:
            raise OptionError(option, value, no_shards_match(missing[0]))
        if option == "data.train":
            try:
                classes = label_count(files[option])
            except DataError as e:
                raise OptionError(option, value, str(e)) from None
            if classes == 0 and cfg.objective.options.NEEDS_LABELS:
                none = f"trains on labels, and --data.train {value!r} has none"
                raise OptionError("objective.kind", cfg.objective.kind, none)
        # Opened as the run's loaders open them (footers, schemas, columns: 0.13 s for 500 shards): a
        # truncated shard was said once the step was traced and the weights made (34 s at base, CPU).
        train = option == "data.train"
        opened = cfg.data.loader_options() if train else {"train": False, "audio_root": cfg.data.audio_root}
        try:
            open_shards(files[option], features=cfg.data.features, **opened)
        except DataError as e:
            raise OptionError(option, value, str(e)) from None
    if "data.train" in files and "data.eval" not in files and cfg.eval_every > 0:
        raise OptionError(
            "data.eval", None,
            f"the held-out evaluation (--eval-every {cfg.eval_every}) of a run on your shards needs held-out "
            "shards of their classes (`birdjepa prepare SRC OUT --vocab TRAIN/vocab.json`); or --eval-every "
            "0 for none",
        )  # fmt: skip
    if len(files) == 2:
        try:
            check_same_labels(files["data.train"], files["data.eval"])
        except DataError as e:
            raise OptionError("data.eval", cfg.data.eval, str(e)) from None
        if cfg.eval_every > 0:  # else a traceback at the first evaluation (its step unsaved), or 1.000
            _check_scorable(files, cfg)


def _check_scorable(files: dict[str, list[str]], cfg: PretrainConfig) -> None:
    """The held-out evaluation scores probes fitted on the train split's labels on the eval split's: both
    need labels, the train split two classes (a split of one scored 1.000 everywhere, its chance too)."""
    every = cfg.eval_every
    off = f"the held-out evaluation (--eval-every {every}) scores probes on labels; or --eval-every 0"
    try:
        counts = {
            option: labelled_classes(files[option], enough)
            for option, enough in (("data.eval", 1), ("data.train", 2))
        }
    except DataError:  # a record batch damaged behind a sound footer: the loader says it as it reads it
        return
    if counts["data.eval"] == 0:
        raise OptionError("data.eval", cfg.data.eval, "has no labelled row (audio prepared without a folder "
                          f"per class?): {off}")  # fmt: skip
    if (n := counts["data.train"]) < 2:
        held = "no labelled row" if n == 0 else "labelled rows of one class alone"
        raise OptionError("data.train", cfg.data.train, f"has {held}: a probe has nothing to tell apart; "
                          f"{off}")  # fmt: skip
