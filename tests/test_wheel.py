"""The built wheel carries what the package needs at run time: the Lua scripts and templates.

The tests import the package from the working tree; this one builds a wheel,
installs it into a fresh virtual environment, and loads every script from the
installed copy, from a directory where the working tree is not importable.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from celery_zsched.store import scripts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, celery_zsched
from celery_zsched.store import scripts
from importlib import resources
print(json.dumps({
    "file": celery_zsched.__file__,
    "sources": {name: scripts.source(name) for name in scripts.SCRIPTS},
    "templates": resources.files("celery_zsched").joinpath(
        "contrib/django/templates").is_dir(),
    "typed": resources.files("celery_zsched").joinpath("py.typed").is_file(),
}))
"""


def test_the_installed_wheel_loads_every_lua_script_with_its_prelude(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # Built from a copy: setuptools leaves build/ and *.egg-info beside the sources.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".tox", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "artifacts",
        "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "-q", "-w", str(dist), str(source)], check=True, timeout=300)
    wheel = next(dist.glob("celery_zsched-*.whl"))
    env_dir = tmp_path / "venv"
    # The package only from the wheel; the run-time dependencies from this
    # interpreter's environment (a venv's, which system_site_packages would
    # skip), added by a path line: the .pth files there, the working tree's
    # editable install among them, are not run.
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_dir = subprocess.run([python, "-c", where], check=True, capture_output=True,
                              text=True).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site_dir, "zsched_test_deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
                   check=True, timeout=300)
    out = subprocess.run([python, "-c", PROBE], cwd=tmp_path, check=True, timeout=60,
                         capture_output=True, text=True).stdout
    found = json.loads(out)
    assert Path(found["file"]).is_relative_to(env_dir), found["file"]
    assert found["sources"] == {name: scripts.source(name) for name in scripts.SCRIPTS}
    assert found["templates"] and found["typed"]
