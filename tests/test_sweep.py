"""Sweep files: every override is validated before anything is submitted, each config's command line
parses back to exactly its config, and the job script does what a preemptible job must."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from birdjepa import exit_codes
from birdjepa.cli import main
from birdjepa.slurm.sweep import SlurmOptions, SweepError, job_script, plan, wait_group

REPO = Path(__file__).resolve().parents[1]


def sweep_file(tmp_path: Path, body: str, name: str = "s") -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(f"def make_cfgs():\n    return {body}\n")
    return path


def test_the_shipped_sweep_resolves(tmp_path: Path) -> None:
    jobs = plan(REPO / "sweeps" / "tiny.py", tmp_path)
    assert [j.cfg.run for j in jobs] == ["tiny-0", "tiny-1"]
    assert [j.cfg.optim.lr for j in jobs] == [1e-3, 3e-3]
    assert all(j.cfg.log.runs_dir == tmp_path.absolute() and j.cfg.data.batch_size == 8 for j in jobs)


@pytest.mark.parametrize(
    "body,message",
    [
        ('[{"steps": 10}, {"optim": {"lrr": 1.0}}]', "config 1: unknown key 'optim.lrr'"),
        ('[{"steps": "10"}]', "config 0: key 'steps' = '10' has the wrong type"),
        ('[{"data.batch_size": 8.5}]', "config 0: key 'data.batch_size' = 8.5 has the wrong type"),
        ('[{"prng": "random"}]', "config 0: key 'prng' = 'random' has the wrong type"),
        # A pair given three values: tyro's usage box, naming no sweep file, exit 0.
        (
            '[{"augment.mix_db": [-20.0, -10.0, -5.0]}]',
            "config 0: key 'augment.mix_db' = [-20.0, -10.0, -5.0] has the wrong type",
        ),
        # A NaN never equals itself: "flags ... do not parse back to the config".
        ('[{"optim.lr": float("nan")}]', "config 0: --optim.lr nan: must be a finite number"),
        ('[{"optim": 3}]', "config 0: key 'optim' is a group"),
        ('[{"steps.x": 3}]', "config 0: unknown key 'steps.x'"),
        (
            '[{"run": "b"}, {"run": "a"}, {"run": "a"}]',
            "configs 1 and 2 share the run directory ",
        ),  # not which
        (  # one folder spelled two ways: both trained it at once
            '[{"run": "a", "log.runs_dir": "x"}, {"run": "a", "log.runs_dir": "y/../x"}]',
            "configs 0 and 1 share the run directory ",
        ),
        ("[]", "non-empty list of dicts, got an empty list"),
        ("[3]", "config 0 is a int"),
        # Dropped, merged or a traceback, and the run went on without a word.
        ('[{"optim.lr": 1e-3, "optim": {"lr": 3e-3}}]', "config 0: optim.lr is set twice"),
        ('[{"steps": 4, "optim": {}}]', "config 0: optim is an empty dict, which sets nothing"),
        ("[{1: 2}]", "config 0: 1 is no option name (1)"),
        # A newline ended the job script's #SBATCH lines, its next line a command of the script.
        ('[{"run": "ok\\ntouch pwned"}]', "config 0: --run 'ok\\ntouch pwned': must be printable UTF-8 text"),
        # Slurm read the rest of the line as a comment (the run's log a file named "lr"), dropped the
        # backslash (its log's folder did not exist: no log, the job failed at launch) or refused the
        # script for an unmatched quote, the configs before it submitted.
        *[
            (f'[{{"run": "lr{c}2"}}]', "#SBATCH lines cannot hold as they are")
            for c in ("#", "\\\\", "'", '\\"')
        ],
        # Refused at its first requeue's start (exit 2, not requeued): the run left half done.
        ('[{"resume": "never"}]', "config 0: --resume never: a sweep's job is requeued"),
    ],
)
def test_bad_overrides_name_file_config_and_key(tmp_path: Path, body: str, message: str) -> None:
    path = sweep_file(tmp_path, body)
    with pytest.raises(SweepError) as e:
        plan(path, tmp_path)
    assert str(e.value).startswith(str(path)) and message in str(e.value)


def test_a_local_sweep_takes_a_path_no_sbatch_line_could_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `sweep --local` from a folder named "lab#2" was refused for its #SBATCH lines, which it never submits.
    path = sweep_file(tmp_path, '[{"run": "lr#2"}]')
    main(["sweep", str(path), "--local", "--dry-run", "--runs-dir", str(tmp_path), "--force-resume-at", "3"])
    out = capsys.readouterr().out
    assert f"# config 0 ({tmp_path / 'lr#2'}), resolved:" in out
    # What --local runs, not the Slurm script it never submits (printed before): stop, then resume.
    pretrain = f"{sys.executable} -m birdjepa.cli pretrain"
    runs = [line for line in out.splitlines() if line.startswith(pretrain)]
    assert "#SBATCH" not in out and len(runs) == 2, out
    assert runs[0].endswith(" --stop-at-step 3") and runs[1] == runs[0].removesuffix(" --stop-at-step 3")


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("def make_cfgs(:\n    return []\n", 1, "SyntaxError: "),
        ("import no_such_module_here\n", 1, "ModuleNotFoundError: No module named 'no_such_module_here'"),
        ("def make_cfgs():\n    x = {}\n    return [x['lr']]\n", 3, "KeyError: 'lr'"),
        ("def make_benchmarks():\n    return 1 / 0\n", 2, "ZeroDivisionError: division by zero"),
        # The sweep ended with exit 0, nothing run and nothing said.
        ("import sys\ndef make_cfgs():\n    sys.exit(0)\n", 3, "SystemExit: 0"),
    ],
)
def test_a_sweep_file_that_fails_is_one_line_naming_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, message: str
) -> None:
    path = tmp_path / "broken.py"  # a traceback through birdjepa's loader before
    path.write_text(text)
    with pytest.raises(SystemExit) as e:
        main(["sweep", str(path), "--dry-run"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {path}:{line}: ") and message in err, err


def test_a_sweep_file_rewritten_at_its_size_and_time_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Imported, it ran from a __pycache__ entry its loader wrote beside it, found by the file's size and
    # time: rewritten in the same second at the same size (a script writing sweeps), its old code ran.
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as where PYTHONDONTWRITEBYTECODE is unset
    path = tmp_path / "sweep.py"
    for lr in ("0.001", "0.002"):
        path.write_text(f'def make_cfgs():\n    return [{{"optim.lr": {lr}}}]\n')
        os.utime(path, ns=(10**18, 10**18))
        (job,) = plan(path, tmp_path)
        assert job.cfg.optim.lr == float(lr)
    assert not (tmp_path / "__pycache__").exists()


def test_a_dataclass_in_a_sweep_file_under_postponed_annotations_loads(tmp_path: Path) -> None:
    # Its annotations strings, dataclasses looks its module up in sys.modules: "AttributeError:
    # 'NoneType' object has no attribute '__dict__'", refused at the class's line.
    path = tmp_path / "sweep.py"
    path.write_text("from __future__ import annotations\nimport dataclasses\n\n\n@dataclasses.dataclass\n"
                    "class Lr:\n    value: float = 3e-3\n\n\ndef make_cfgs():\n"
                    "    return [{'optim.lr': Lr().value}]\n")  # fmt: skip
    (job,) = plan(path, tmp_path)
    assert job.cfg.optim.lr == 3e-3


def test_every_type_round_trips_through_the_command_line(tmp_path: Path) -> None:
    body = (
        '[{"ckpt_async": False, "debug.roundtrip_steps": [3, 5], "stop_at_step": None, "optim.lr": 2e-3,'
        ' "objective": {"kind": "supervised"}, "data.features.f_max": 10000.0, "model.preset": "small",'
        ' "log.wandb": "offline", "debug.disable_stochastic": True, "log.wandb_project": "-x"}]'
    )
    (job,) = plan(sweep_file(tmp_path, body), tmp_path)  # "-x" as two words: tyro's usage box
    cfg = job.cfg
    assert cfg.log.wandb_project == "-x" and "--log.wandb-project=-x" in job.flags
    assert cfg.ckpt_async is False and cfg.debug.roundtrip_steps == (3, 5) and cfg.optim.lr == 2e-3
    assert cfg.objective.kind == "supervised" and cfg.data.features.f_max == 10000.0
    assert "--no-ckpt-async" in job.flags and "--debug.disable-stochastic" in job.flags


def test_a_sweep_into_a_folder_it_cannot_write_starts_nothing_and_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A read-only runs folder: an OSError's traceback from the first job's job.sbatch.
    from birdjepa.cli import main

    (tmp_path / "runs").write_text("")  # a file where the runs folder goes
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(
            [
                "sweep",
                str(REPO / "sweeps" / "tiny.py"),
                "--local",
                "--runs-dir",
                str(tmp_path / "runs" / "in"),
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 74 and err.startswith("error: config 0: ") and err.count("\n") == 1, err
    assert err.endswith(
        "cannot be written (" + str(tmp_path / "runs") + " is a file, not a folder); nothing was started\n"
    )


def test_force_resume_must_fall_inside_the_run_and_before_its_stop(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="--force-resume-at 40 is not inside its 40 steps"):
        plan(REPO / "sweeps" / "tiny.py", tmp_path, force_resume_at=40)
    # After the config's --stop-at-step on the command line, it won: the run trained past the config's
    # stop, and its requeued start was refused (exit 2, not requeued).
    path = sweep_file(tmp_path, '[{"steps": 8, "stop_at_step": 2}]')
    with pytest.raises(SweepError, match="config 0: --force-resume-at 2 is not before its stop_at_step 2"):
        plan(path, tmp_path, force_resume_at=2)
    assert plan(path, tmp_path, force_resume_at=1)


def test_job_script_is_requeueable_and_forwards_the_warning_signal(tmp_path: Path) -> None:
    (job, _) = plan(REPO / "sweeps" / "tiny.py", tmp_path)
    slurm = SlurmOptions(partition="low", hours=1.5, grace=90, ntasks=1, extra=("--constraint=x",))
    script = job_script(job, slurm, 15, REPO)
    for line in ("#SBATCH --requeue", "#SBATCH --signal=B:USR1@90", "#SBATCH --time=1:30:00",
                 "#SBATCH --partition=low", "#SBATCH --constraint=x", "force=15"):  # fmt: skip
        assert line in script.splitlines(), line
    assert f"#SBATCH --output={tmp_path.absolute()}/tiny-0/slurm-%j.out" in script
    assert 'scontrol requeue "${SLURM_JOB_ID:-}"' in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)  # valid bash
    # A % in the runs folder, which Slurm's --output pattern expands: the job failed at launch, unlogged.
    (job, _) = plan(REPO / "sweeps" / "tiny.py", tmp_path / "lr%x")
    script = job_script(job, slurm, 15, REPO)
    assert f"#SBATCH --output={tmp_path.absolute()}/lr%%x/tiny-0/slurm-%j.out" in script


@pytest.mark.parametrize(
    ("options", "said"),
    [
        # The warning came at each start: a step trained, saved and requeued, for ever.
        (["--slurm.hours", "0.0167", "--slurm.grace", "120"], "--slurm.grace 120: not below the job's time "),
        (["--slurm.hours", "0"], "--slurm.hours 0.0: must be > 0"),  # it became 1 minute
        (["--slurm.cpus", "0"], "--slurm.cpus 0: must be >= 1"),
        # Unquoted in #SBATCH lines: the rest of the value a line of its own, a command ending the options.
        (["--slurm.partition", "gpu debug"], "--slurm.partition 'gpu debug': a space, a control"),
        (["--slurm.mem", "16G\nsrun hostname"], "--slurm.mem '16G\\nsrun hostname': a space, a"),
    ],
)
def test_slurm_options_no_job_can_run_with_are_refused(
    tmp_path: Path, options: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["sweep", str(REPO / "sweeps" / "tiny.py"), "--dry-run", "--runs-dir", str(tmp_path), *options])
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err and err.count("\n") == 1, err


def test_dry_run_prints_configs_and_scripts_and_submits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    main(["sweep", str(REPO / "sweeps" / "tiny.py"), "--dry-run", "--runs-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.count("#!/bin/bash") == 2 and "--optim.lr 0.003" in out
    assert '"lr": 0.003' in out and '"batch_size": 8' in out  # the resolved configs
    assert not list(tmp_path.iterdir())
    # Where sbatch fails (here: none on PATH), one line saying what was submitted (a traceback). (A real
    # process's error is one line: test_validation's test_the_real_process_prints_one_line_and_no_traceback.)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    with pytest.raises(SystemExit) as done:
        main(["sweep", str(REPO / "sweeps" / "tiny.py"), "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert done.value.code == 1 and err.count("\n") == 1, err
    assert err.startswith("error: config 0: sbatch is not on PATH"), err


@pytest.mark.slow  # two trainings; the job script's requeue is proved below in the suite
def test_local_sweep_runs_each_config_here_with_a_forced_resume(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = {"data.train": str(demo_dir / "train"), "data.eval": str(demo_dir / "eval"), "data.batch_size": 8}
    # The step count and batch of the other tests' runs, whose compiled step this one then reuses.
    cfg = {"steps": 6, "eval_every": 0, "ckpt_every": 3, **data}
    path = sweep_file(tmp_path, repr([cfg]), name="local")
    capsys.readouterr()
    main(["sweep", str(path), "--local", "--runs-dir", str(tmp_path / "runs"), "--force-resume-at", "0"])
    assert "local exit 0" in capsys.readouterr().out
    run_dir = tmp_path / "runs" / "local-0"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x.get("event") == "stop"] == [0]
    assert [x["restart"] for x in lines if x.get("event") == "resume"] == [1]
    assert max(x["step"] for x in lines if "train/loss" in x) == 5
    # The same sweep again (after a Ctrl-C, or finished): the forced stop was refused, "has trained that
    # step already", exit 2; a run past it is resumed as it is.
    main(["sweep", str(path), "--local", "--runs-dir", str(tmp_path / "runs"), "--force-resume-at", "0"])
    assert "local (past the forced stop) exit 0" in capsys.readouterr().out


def test_a_sweep_edited_after_its_runs_trained_is_refused_before_anything_is_submitted(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Its jobs waited in the queue to exit 65 at their start, and each run's job.sbatch was rewritten
    # with options that never trained it.
    import tyro
    from conftest import a_demo_shard_beside_its_vocabulary, rewrite_meta

    from birdjepa.config import PretrainConfig
    from birdjepa.pretrain.loop import pretrain

    data = {"data.train": str(demo_dir / "train"), "data.eval": str(demo_dir / "eval"), "data.batch_size": 8}
    cfg = {"steps": 6, "eval_every": 0, "stop_at_step": 0, **data}
    (job,) = plan(sweep_file(tmp_path, repr([cfg])), tmp_path)
    assert pretrain(tyro.cli(PretrainConfig, args=job.flags)) == 0
    script = job.cfg.run_dir / "job.sbatch"
    script.write_text("the script that trained it")
    edited = sweep_file(tmp_path, repr([{**cfg, "optim.lr": 0.002}]))
    with pytest.raises(SweepError, match=r"config 0: run .* has checkpoint 0, trained with other options "
                       r"than these \(optim.lr:0.001->0.002\)"):  # fmt: skip
        plan(edited, tmp_path)
    assert script.read_text() == "the script that trained it"
    # An option that lays out the data stream: no flag changes it within a run (it advised
    # allow_config_change=True, and the job then exited 65).
    for allowed in (False, True):
        edited = sweep_file(tmp_path, repr([{**cfg, "data.batch_size": 4, "allow_config_change": allowed}]))
        with pytest.raises(SweepError, match=r"\(data.batch_size:8->4\), and data.batch_size:8->4 cannot "
                           r"change within a run, allow_config_change=True neither .*: give the config "
                           r"another run, or leave them out"):  # fmt: skip
            plan(edited, tmp_path)
    # An override dropped (or a default changed since): its job resumes the checkpoint's value, where
    # --dry-run printed the default; said, as pretrain says it at the resume.
    dropped = {k: v for k, v in cfg.items() if k not in ("data.batch_size", "stop_at_step")}
    (job,) = plan(path := sweep_file(tmp_path, repr([dropped])), tmp_path)
    assert job.kept == ("data.batch_size:16->8",)
    main(["sweep", str(path), "--dry-run", "--runs-dir", str(tmp_path)])
    said = f"WARNING config 0: run {job.cfg.run_dir.absolute()} resumes options from its checkpoint that the "
    assert said + "config gives other values (data.batch_size:16->8: the config's, then the checkpoint's" in (
        capsys.readouterr().out
    )
    # A run recorded before --data.features.gapless trains on without it, as its job says: not an override
    # dropped ("set them in the config to train them", which the run then refused).
    old = shutil.copytree(job.cfg.run_dir, tmp_path / "old" / job.cfg.run_dir.name)
    meta_file = old / "checkpoints" / "0" / "meta" / "metadata"
    meta = {k: v for k, v in json.loads(meta_file.read_text()).items() if k != "meta_crc"}
    del meta["config"]["data"]["features"]["gapless"]
    rewrite_meta(meta_file, meta)
    again = {**cfg, "stop_at_step": 3, "log.runs_dir": str(old.parent)}
    (then,) = plan(sweep_file(tmp_path, repr([again])), tmp_path)
    assert then.kept == () and then.cfg.data.features.gapless  # the file's; its job trains False, and says so
    # A run recorded since, with gapless=False dropped from the file, is warned as any option dropped.
    meta["config"]["data"]["features"]["gapless"] = False
    rewrite_meta(meta_file, meta)
    (since,) = plan(sweep_file(tmp_path, repr([again])), tmp_path)
    assert since.kept == ("data.features.gapless:True->False",)
    # Pointed at other shards: planned, and refused at the job's start by the dataset check (exit 65).
    other = tmp_path / "other"
    shard = a_demo_shard_beside_its_vocabulary(demo_dir, other)
    (other / shard.name).write_bytes(shard.read_bytes())
    moved = {**cfg, "stop_at_step": 3, "data.train": str(other)}
    said = rf"config 0: run .* has checkpoint 0, trained on data of fingerprint \w+; data.train '{other}' "
    with pytest.raises(SweepError, match=said + r"reads as \w+ \(other shards"):
        plan(sweep_file(tmp_path, repr([moved])), tmp_path)
    # Not where its job checks no data: warned past (resume_checks warn), or finished ("nothing to do").
    assert plan(sweep_file(tmp_path, repr([{**moved, "resume_checks": "warn"}])), tmp_path)
    ended = {
        **{k: v for k, v in moved.items() if k != "stop_at_step"},
        "steps": 1,
        "allow_config_change": True,
    }
    with pytest.raises(SweepError, match=r"has trained through step 0, and steps 1 would end it there"):
        plan(sweep_file(tmp_path, repr([ended])), tmp_path)  # the trainer's refusal, exit 65
    finished = shutil.copytree(job.cfg.run_dir, tmp_path / "finished" / job.cfg.run_dir.name)
    meta_file = finished / "checkpoints" / "0" / "meta" / "metadata"
    meta = {k: v for k, v in json.loads(meta_file.read_text()).items() if k != "meta_crc"}
    rewrite_meta(meta_file, {**meta, "config": {**meta["config"], "steps": 1}})  # a run of 1 step, done
    assert plan(sweep_file(tmp_path, repr([{**ended, "log.runs_dir": str(finished.parent)}])), tmp_path)
    # Its stop, now past: planned, and refused at the job's start (exit 2).
    with pytest.raises(SweepError, match=r"config 0: stop_at_step 0: run .* has trained that step already"):
        plan(sweep_file(tmp_path, repr([cfg])), tmp_path)
    # Harmless changes, and a change the config allows, plan as before.
    later = {**cfg, "stop_at_step": 3}
    assert plan(sweep_file(tmp_path, repr([{**later, "log.print_every": 3}])), tmp_path)
    assert plan(
        sweep_file(tmp_path, repr([{**later, "optim.lr": 0.002, "allow_config_change": True}])), tmp_path
    )


def benchmark_sweep(tmp_path: Path, entries: str) -> Path:
    path = tmp_path / "bench.py"
    path.write_text(f"def make_benchmarks():\n    return {entries}\n")
    return path


def test_a_benchmark_sweep_checks_every_option_then_runs_each_job(
    birdset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from birdjepa.benchmark import store

    train, test = (str(birdset_dir / "SYN1" / s) for s in ("train", "test_5s"))
    good = {"backbone": ["raw"], "train": train, "test": test}
    for entry, message in (
        ({"backbone": "raw"}, "entry 1: option 'backbone' = 'raw' has the wrong type"),
        # The values too, as the job checks them: these failed only once the job ran (on Slurm, queued).
        ({**good, "train": "a"}, "entry 1: no shard files match 'a' (a relative path: read from "),
        ({**good, "probe": ["centriod"]}, "entry 1: probes are "),
        ({**good, "n_train": [0]}, "n is -1 (all) or >= 1"),
        ({**good, "backbone": []}, "entry 1: give --backbone"),
        ({**good, "seed": []}, "entry 1: --seed: give at least one value"),  # 0 fitted, exit 0
        ({**good, "results": str(tmp_path / "a\nb")}, "entry 1: its results folder"),
        ({**good, "metric": "auroc"}, "entry 1: unknown option 'metric'"),  # --metric goes with --table
        ({**good, "batch_size": 0}, "entry 1: --batch-size 0: must be >= 1"),
        ({**good, "n_workers": -1}, "entry 1: --n-workers -1: must be >= 0"),
    ):
        bad = benchmark_sweep(tmp_path, repr([good, entry]))
        with pytest.raises(SystemExit) as e:
            main(["sweep", str(bad), "--dry-run"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and err.count("\n") == 1, err
    # The options only a pretrain sweep reads: a benchmark sweep ran without them, not a word said.
    for option in (["--force-resume-at", "3"], ["--runs-dir", "x"], ["--slurm.ntasks", "2"]):
        with pytest.raises(SystemExit) as e:
            main(["sweep", str(benchmark_sweep(tmp_path, repr([good]))), "--dry-run", *option])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"a benchmark sweep (make_benchmarks) has no {option[0]}" in err, err
    # A file name #SBATCH lines cannot hold (its job's name and log file); a value that looks like a flag.
    spaced = tmp_path / "my bench.py"
    spaced.write_text(f"def make_benchmarks():\n    return {[good]!r}\n")
    with pytest.raises(SystemExit) as e:
        main(["sweep", str(spaced), "--dry-run"])
    assert (
        e.value.code == 2 and "entry 0: its name (the sweep file's) 'my bench-0'" in capsys.readouterr().err
    )
    main(["sweep", str(benchmark_sweep(tmp_path, repr([{**good, "task": "-T"}]))), "--dry-run"])
    assert "--task=-T" in capsys.readouterr().out  # `--task -T`: "Missing value for argument '--task'"
    results = tmp_path / "results"
    entries = [
        {"backbone": ["raw"], "train": str(birdset_dir / t / "train"),
         "test": str(birdset_dir / t / "test_5s"), "task": t, "probe": ["centroid"], "n_train": [1, -1],
         "results": str(results)}
        for t in ("SYN1", "SYN2")
    ]  # fmt: skip
    path = benchmark_sweep(tmp_path, repr(entries))
    main(["sweep", str(path), "--dry-run"])
    out = capsys.readouterr().out
    assert out.count("#SBATCH --requeue") == 2 and "--n-train 1 -1" in out and not results.exists()
    main(["sweep", str(path), "--dry-run", "--local"])  # the commands it runs here, no Slurm script
    out = capsys.readouterr().out
    assert "#SBATCH" not in out and out.count(f"{sys.executable} -m birdjepa.cli benchmark ") == 2, out
    main(["sweep", str(path), "--local"])
    assert capsys.readouterr().out.count("local exit 0") == 2
    rows = store.read(results).to_pylist()
    assert sorted((r["task"], r["n"]) for r in rows) == [("SYN1", -1), ("SYN1", 1), ("SYN2", -1), ("SYN2", 1)]
    assert sorted(p.name for p in (results / "jobs").glob("*.sbatch")) == ["bench-0.sbatch", "bench-1.sbatch"]


def traps_set(pid: int, sigs: tuple[int, ...], timeout_s: float = 30.0) -> None:
    """Wait until process ``pid`` catches each of ``sigs`` (its ``SigCgt`` in /proc: a shell's traps are
    set); one second where there is no /proc to read."""
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        time.sleep(1.0)
        return
    want = sum(1 << (sig - 1) for sig in sigs)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        caught = next(
            int(line.split()[1], 16) for line in status.read_text().splitlines() if line.startswith("SigCgt:")
        )
        if caught & want == want:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} set no traps for {sigs} in {timeout_s} s")


def run_job_script(
    tmp_path: Path,
    trainer: str,
    signal_name: str | None = None,
    state: str = "RUNNING",
    job: str | None = "4242",
) -> tuple[int, list[str]]:
    """The sweep's real job script under bash, its trainer replaced by ``trainer`` (a bash command) and
    a stub ``scontrol`` on PATH that records its calls and shows the job in ``state``; ``signal_name``
    is sent to the script's shell as Slurm sends it. Returns the script's exit code and the scontrol
    calls that change something."""
    import re
    import signal as signals

    (first, _) = plan(REPO / "sweeps" / "tiny.py", tmp_path)
    script = job_script(first, SlurmOptions(grace=90), None, tmp_path)
    script, n = re.subn(r"^cmd=\(.*\)$", f"cmd=(bash -c {shlex.quote(trainer)})", script, flags=re.M)
    assert n == 1
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    calls = tmp_path / "scontrol.calls"
    preempted = "None" if state == "CANCELLED" else "2026-12-06T07:17:57"  # as scancel leaves it
    shown = f"JobId=4242 JobState=COMPLETING PreemptTime={preempted}"
    show = f'if [ "$1" = show ]; then echo "{shown}"; exit 0; fi\n'
    (stub / "scontrol").write_text(f'#!/bin/bash\n{show}echo "$@" >> {calls}\n')
    (stub / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "SLURM_JOB_ID": job or ""}
    if job is None:  # run by hand, outside Slurm
        del env["SLURM_JOB_ID"]
    proc = subprocess.Popen(["bash", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    if signal_name is not None:
        traps_set(proc.pid, (signals.SIGUSR1, signals.SIGTERM))  # the trainer runs (started before them)
        proc.send_signal(getattr(signals, signal_name))
    _, err = proc.communicate(timeout=60)
    assert "unbound variable" not in err, err  # outside Slurm, the requeue line's ${SLURM_JOB_ID}: exit 1
    return proc.returncode, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize(
    ("trainer", "signal_name", "code", "requeued"),
    [
        ("exit 75", None, 0, True),  # the trainer saved on a signal: requeue, the job ends 0
        ("exit 0", None, 0, False),  # finished
        ("exit 65", None, 65, False),  # a failed resume check: a requeue would fail again
        ("exit 70", None, 70, False),  # non-finite
        ("exit 74", None, 74, False),  # a full disk: not requeued onto the same disk
        ("sleep 30", "SIGUSR1", 0, True),  # killed by the forwarded signal before its handler: 138 -> 75
        ("sleep 30", "SIGTERM", 0, True),  # a preemption's TERM: 143 -> 75
    ],
)  # fmt: skip
def test_the_job_script_requeues_exactly_on_75_and_on_a_forwarded_signal(
    tmp_path: Path, trainer: str, signal_name: str | None, code: int, requeued: bool
) -> None:
    exit_code, calls = run_job_script(tmp_path, trainer, signal_name)
    assert (exit_code, calls) == (code, ["requeue 4242"] if requeued else [])


def test_the_job_script_run_by_hand_outside_slurm_ends_as_its_trainer_asked(tmp_path: Path) -> None:
    assert run_job_script(tmp_path, "exit 75", job=None) == (0, ["requeue "])


def test_the_job_script_does_not_requeue_a_job_the_user_cancelled(tmp_path: Path) -> None:
    # scancel's TERM was taken for a preemption's: the trainer saved, and the job was requeued and ran on.
    assert run_job_script(tmp_path, "sleep 30", "SIGTERM", state="CANCELLED") == (143, [])


@pytest.mark.slow  # a sweep in a process group of its own, its trainer stopped by a Ctrl-C: ~20 s
def test_a_ctrl_c_stops_a_local_sweep_once_its_trainer_saved(demo_dir: Path, tmp_path: Path) -> None:
    from birdjepa.rundir.checkpoint import Checkpointer
    from birdjepa.rundir.metrics_log import metrics_by_step, read_metrics

    data = {"data.train": str(demo_dir / "train"), "data.eval": str(demo_dir / "eval"), "data.batch_size": 8}
    cfg = {"steps": 400, "eval_every": 0, "ckpt_every": 1000, **data}
    path = sweep_file(tmp_path, repr([cfg, {**cfg, "seed": 1}]), name="ctrl")
    runs = tmp_path / "runs"
    argv = ["birdjepa", "sweep", str(path), "--local", "--runs-dir", str(runs)]
    # As a terminal runs it: SIGINT handled by Python (a test worker may ignore it, and children inherit
    # that), in a process group of its own that the Ctrl-C goes to, the sweep and its trainer alike.
    start = (f"import signal, sys, runpy; signal.signal(signal.SIGINT, signal.default_int_handler); "
             f"sys.argv = {argv!r}; runpy.run_module('birdjepa.cli', run_name='__main__')")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", start], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    first = runs / "ctrl-0"
    while not (first / "metrics.jsonl").exists() or not metrics_by_step(first):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "local exit 130" in out, out  # the sweep's own exit was 1
    (stop,) = [x for x in read_metrics(first) if x.get("event") == "stop"]
    assert stop["exit_code"] == 130 and Checkpointer(first).latest_step() == stop["step"] < 399
    assert not (runs / "ctrl-1").exists()  # the sweep stopped too: the second config never started


def test_a_sweep_file_of_both_kinds_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # make_cfgs was dropped without a word.
    path = tmp_path / "both.py"
    path.write_text("def make_cfgs():\n    return [{}]\ndef make_benchmarks():\n    return [{}]\n")
    with pytest.raises(SystemExit) as e:
        main(["sweep", str(path), "--dry-run"])
    assert e.value.code == 2 and "defines both make_cfgs() and make_benchmarks()" in capsys.readouterr().err


def test_a_sweep_file_s_own_code_runs_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Asked for make_benchmarks, then make_cfgs: its module ran twice (its prints, the folders it makes).
    path = tmp_path / "once.py"
    path.write_text("print('EXECUTED')\ndef make_cfgs():\n    return [{'steps': 4}]\n")
    main(["sweep", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs")])
    assert capsys.readouterr().out.count("EXECUTED") == 1
    # Whatever its name ends in (an AssertionError's traceback), importing a module beside it (a shared
    # base config), as `python FILE` does.
    (tmp_path / "shared_base.py").write_text("BASE = {'steps': 4}\n")
    plain = tmp_path / "noext"
    plain.write_text("from shared_base import BASE\ndef make_cfgs():\n    return [dict(BASE)]\n")
    main(["sweep", str(plain), "--dry-run", "--runs-dir", str(tmp_path / "runs")])
    assert "--steps 4" in capsys.readouterr().out


def test_a_group_whose_process_failed_stops_the_others_after_a_grace_and_exits_with_the_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A group cannot go on without one of its processes: the others waited for it in a collective, and
    # where it was the coordinator, aborted with a C++ stack (srun's --kill-on-bad-exit on Slurm).
    def start(code: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", code])

    t0 = time.monotonic()
    group = [start("import time; time.sleep(120)"), start("raise SystemExit(3)")]
    assert wait_group(group, grace_s=0.5) == 3
    assert time.monotonic() - t0 < 30 and group[0].returncode == -signal.SIGKILL
    said = capsys.readouterr().err
    assert said == "sweep: stopped process 0 of 2, still running 0 s after process 1 ended\n"
    # One killed by a signal said nothing of itself: said, and its code is the group's.
    group = [start("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), start("pass")]
    assert wait_group(group, grace_s=0.5) == -signal.SIGKILL
    assert capsys.readouterr().err == "sweep: process 0 of 2 was killed by SIGKILL\n"
    assert wait_group([start("pass"), start("pass")]) == 0


def test_a_process_whose_coordinator_port_is_taken_says_so_in_one_line(
    demo_dir: Path, tmp_path: Path
) -> None:
    # Process 0 serves the group's coordinator: a port in use was a traceback ("Failed to start RPC
    # server") or a segmentation fault, and the others waited 300 s for it, then aborted.
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        group = {"BIRDJEPA_NUM_PROCESSES": "2", "BIRDJEPA_PROCESS_ID": "0",
                 "BIRDJEPA_COORDINATOR": f"127.0.0.1:{port}"}  # fmt: skip
        argv = [sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", "r", "--log.runs-dir",
                str(tmp_path), "--data.train", str(demo_dir / "train")]  # fmt: skip
        done = subprocess.run(argv, env={**os.environ, **group}, capture_output=True, text=True, timeout=120)
    assert done.returncode == exit_codes.GROUP_BROKEN, done.stderr[-3000:]
    assert done.stderr == (
        f"error: process 0 of 2 could not join the process group (its port {port} is in use by another "
        f"program; the coordinator's address BIRDJEPA_COORDINATOR=127.0.0.1:{port}); exit 69\n"
    )
    assert not (tmp_path / "r").exists()
