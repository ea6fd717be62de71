"""Packages à la carte: each builds its own wheel, installs alone in a fresh virtualenv with
only its workspace dependencies' wheels, imports its public API, and runs the example in
its README (marked `<!-- example -->`), so the example cannot rot.

lr-config and lr-tui must install and work without torch. The uv cache is reused, so the
heavy dependencies install by link, not by download.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = {
    "lr-config": ROOT / "packages" / "lr-config",
    "lr-checkpoint": ROOT / "packages" / "lr-checkpoint",
    "lr-publish": ROOT / "packages" / "lr-publish",
    "lr-engine": ROOT / "packages" / "lr-engine",
    "lr-tui": ROOT / "apps" / "lr-tui",
}
TORCH_FREE = {"lr-config", "lr-tui"}
UV = shutil.which("uv")

pytestmark = pytest.mark.skipif(UV is None, reason="uv is installed by .ci/run and the README's commands")


def workspace_deps(name: str) -> list[str]:
    """The package and its workspace dependencies, dependencies first."""
    project = tomllib.loads((MEMBERS[name] / "pyproject.toml").read_text())["project"]
    ours = [d for d in (re.split(r"[<>=!~;\[ ]", dep)[0] for dep in project["dependencies"]) if d in MEMBERS]
    order: list[str] = []
    for dep in ours:
        for item in workspace_deps(dep):
            if item not in order:
                order.append(item)
    return order + [name]


def readme_example(name: str) -> str:
    text = (MEMBERS[name] / "README.md").read_text()
    match = re.search(r"<!-- example -->\s*```python\n(.*?)```", text, re.S)
    assert match, f"{name}/README.md has no <!-- example --> python block"
    return match.group(1)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    for name in MEMBERS:
        proc = subprocess.run([UV, "build", "--package", name, "--wheel", "-o", str(out), "-q"], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    return out


def test_each_wheel_has_metadata_and_py_typed(wheels: Path) -> None:
    import zipfile

    for name in MEMBERS:
        wheel = next(wheels.glob(f"{name.replace('-', '_')}-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            assert f"{name.replace('-', '_')}/py.typed" in names
            meta = zf.read(next(n for n in names if n.endswith("METADATA"))).decode()
        assert "Version: 0.1.0" in meta and "Summary: " in meta and "License-Expression: Apache-2.0" in meta


@pytest.mark.parametrize("name", list(MEMBERS))
def test_installs_alone_and_runs_its_readme_example(name: str, wheels: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    files = [str(next(wheels.glob(f"{dep.replace('-', '_')}-*.whl"))) for dep in workspace_deps(name)]
    env = {**os.environ, "UV_LINK_MODE": "hardlink"}
    proc = subprocess.run([UV, "pip", "install", "-q", "--python", str(python), *files], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    installed = subprocess.run([UV, "pip", "list", "--python", str(python)], capture_output=True, text=True).stdout
    others = [m for m in MEMBERS if m not in workspace_deps(name) and re.search(rf"^{m}\s", installed, re.M)]
    assert not others, f"{name} pulled in {others}"
    if name in TORCH_FREE:
        assert not re.search(r"^torch\s", installed, re.M), f"{name} installed torch"
    module = name.replace("-", "_")
    check_api = f"import {module}; missing = [n for n in {module}.__all__ if not hasattr({module}, n)]; assert not missing, missing"
    example = readme_example(name)
    script = tmp_path / "example.py"
    script.write_text(f"{check_api}\n{example}\n")
    run = subprocess.run([str(python), str(script)], capture_output=True, text=True, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    if name in TORCH_FREE:
        probe = subprocess.run([str(python), "-c", f"import sys, {module}; print('torch' in sys.modules)"], capture_output=True, text=True)
        assert probe.stdout.strip() == "False"
