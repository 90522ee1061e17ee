"""The README's install line works from a clone: a fresh venv, `pip install -e ".[cli]"`, the `mrtr` script runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.flowkit import ROOT_DIR

pytestmark = pytest.mark.spawns


def test_the_readme_install_line_installs_a_working_mrtr_script(tmp_path: Path) -> None:
    readme = (ROOT_DIR / "README.md").read_text()
    (line,) = re.findall(r'^(python -m pip install -e "\.\[cli\]")', readme, re.M)  # the README's own line
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    command = line.replace("python", str(python), 1).replace('"', "").split()
    install = subprocess.run(command, cwd=ROOT_DIR, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    run = subprocess.run([str(venv / "bin" / "mrtr"), "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "call" in run.stdout and "tasks" in run.stdout
