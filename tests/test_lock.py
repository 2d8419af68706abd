"""The locked set-up: `make build` installs the Python dependencies from uv.lock, refusing a lock that
no longer matches pyproject.toml, and the committed lock matches it."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UV = REPO / ".venv" / "bin" / "uv"


def build_sync_command() -> list[str]:
    """The dependency install of `make build`, as make would run it (``make -n``: printed, not run)."""
    recipe = subprocess.run(
        ["make", "-n", "-B", "build"], cwd=REPO, capture_output=True, text=True, check=True
    )
    (line,) = [x for x in recipe.stdout.splitlines() if " sync " in x]
    return [w for w in shlex.split(line) if "=" not in w or w.startswith("-")]


PROBE = """\
[project]
name = "lockprobe"
version = "0"
requires-python = ">=3.11"
dependencies = []
[project.optional-dependencies]
dev = []
"""
LOCAL_DEP = """\
[project]
name = "localdep"
version = "1"
requires-python = ">=3.11"
dependencies = []
"""
NEEDS_LOCAL_DEP = 'dependencies = ["localdep"]\n[tool.uv.sources]\nlocaldep = { path = "dep" }'


def test_make_build_installs_from_the_lock_and_refuses_a_stale_one(tmp_path: Path) -> None:
    cmd = build_sync_command()
    assert "--locked" in cmd
    env = {
        "UV_PROJECT_ENVIRONMENT": str(tmp_path / "venv"),
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
    }
    dry = [str(UV), *cmd[1:], "--dry-run", "--offline"]
    real = tmp_path / "real"
    real.mkdir()
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(REPO / name, real / name)
    ok = subprocess.run(dry, cwd=real, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr  # the committed lock matches pyproject.toml
    # Refusing a stale lock, on a project whose only dependency is a local folder: uv resolves a changed
    # requirement again to compare, and for our own dependencies that needs the index (every platform the
    # lock covers), which a test should not.
    probe = tmp_path / "probe"
    (probe / "dep").mkdir(parents=True)
    (probe / "pyproject.toml").write_text(PROBE)
    (probe / "dep" / "pyproject.toml").write_text(LOCAL_DEP)
    subprocess.run([str(UV), "lock", "--offline", "--quiet"], cwd=probe, env=env, check=True)
    assert subprocess.run(dry, cwd=probe, env=env, capture_output=True).returncode == 0
    (probe / "pyproject.toml").write_text(PROBE.replace("dependencies = []", NEEDS_LOCAL_DEP, 1))
    refused = subprocess.run(dry, cwd=probe, env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "needs to be updated" in refused.stderr, refused.stderr
