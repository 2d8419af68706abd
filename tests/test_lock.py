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


def test_make_build_installs_from_the_lock_and_refuses_a_stale_one(tmp_path: Path) -> None:
    cmd = build_sync_command()
    assert "--locked" in cmd
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    env = {
        "UV_PROJECT_ENVIRONMENT": str(tmp_path / "venv"),
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
    }
    dry = [str(UV), *cmd[1:], "--dry-run", "--offline"]
    ok = subprocess.run(dry, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr  # the committed lock matches pyproject.toml
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"tqdm>=4.66",', '"tqdm>=4.66",\n    "rich>=13",'))
    stale = subprocess.run(dry, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert stale.returncode != 0 and "needs to be updated" in stale.stderr, stale.stderr
