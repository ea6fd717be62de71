"""Every CLI refuses bad input cleanly: the corpus in bad_inputs/corpus.json, one test.

Each case runs the real CLI in a subprocess (or, for the TUI's launch form, lr-config's
`parse_train_config` + `build_launch` / `build_slurm_script` in process) from inside its
own folder, with the caches (LR_CACHE_DIR, HF_HOME) pointed into that folder and the Hub
endpoint at a closed port. It must exit 2 (verify: 1, by its contract), print a message
holding the corpus' `expect` text and no traceback, and leave the folder exactly as it
was: every file byte-identical and nothing new, not even an empty folder.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lr_config import ConfigError, LaunchSpec, TrainConfig, build_launch, build_slurm_script, parse_train_config, save_json, to_dict

from _support.procs import run_cli, subprocess_env
from _support.runs import PLANTED_TOKEN, copy_run, tree_digest

CORPUS_FILE = Path(__file__).parent / "bad_inputs" / "corpus.json"
CASES: list[dict[str, Any]] = json.loads(CORPUS_FILE.read_text())["cases"]
MODULES = {"lr-engine": "lr_engine.cli", "lr-checkpoint": "lr_checkpoint.cli", "lr-publish": "lr_publish.cli"}
BASE_FIXTURES = {"dataset": "demo_dataset", "video_dataset": "video_dataset", "run": "tiny_run", "dcp_run": "dcp_run"}


def _key_path(dotted: str) -> list[str]:
    """`a.b\\.c` -> ['a', 'b.c'] (feature names hold dots)."""
    return [part.replace("\\.", ".") for part in re.split(r"(?<!\\)\.", dotted)]


def _edit_json(path: Path, dotted: str, value: Any, *, delete: bool = False) -> None:
    data = json.loads(path.read_text())
    *parents, last = _key_path(dotted)
    node = data
    for part in parents:
        node = node[part]
    if delete:
        del node[last]
    else:
        node[last] = value
    path.write_text(json.dumps(data, indent=2))


def _fixture_path(request: pytest.FixtureRequest, base: str) -> Path:
    value = request.getfixturevalue(BASE_FIXTURES[base])
    return value if isinstance(value, Path) else value.path


def _make_base(request: pytest.FixtureRequest, base: str | None, dest: Path) -> None:
    if base is None:
        dest.mkdir()
    elif base == "config":
        save_json(dest / "train_config.json", to_dict(TrainConfig()))
    else:
        copy_run(_fixture_path(request, base), dest)


def _apply(request: pytest.FixtureRequest, root: Path, op: list[Any]) -> None:
    kind, rel, *args = op
    path = root / rel
    if kind == "delete":
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    elif kind == "truncate":
        path.write_bytes(path.read_bytes()[: args[0]])
    elif kind == "json":
        _edit_json(path, args[0], args[1])
    elif kind == "json_del":
        _edit_json(path, args[0], None, delete=True)
    elif kind == "write":
        path.write_text(args[0])
    elif kind == "rename":
        path.rename(root / args[0])
    elif kind == "symlink":
        path.symlink_to(args[0])
    elif kind == "replace_bytes":  # [replace_bytes, file, old, new]: every occurrence
        data = path.read_bytes()
        assert args[0].encode() in data, (rel, args[0])
        path.write_bytes(data.replace(args[0].encode(), args[1].encode()))
    elif kind == "parquet":  # [parquet, file, column, row, value]
        table = pq.read_table(path)
        values = table.column(args[0]).to_pylist()
        values[args[1]] = args[2]
        index = table.column_names.index(args[0])
        pq.write_table(table.set_column(index, args[0], pa.array(values, table.schema.field(args[0]).type)), path)
    elif kind == "copy":  # [copy, other base, from, to]: replace `to` with the other base's `from`
        source = _fixture_path(request, rel) / args[0]
        target = root / args[1]
        shutil.rmtree(target)
        shutil.copytree(source, target, symlinks=True)
    else:
        raise AssertionError(f"unknown break op {kind!r}")


def _fill(text: str, places: dict[str, str]) -> str:
    for name, value in places.items():
        text = text.replace("{" + name + "}", value)
    return text


def _run_tui_case(case: dict[str, Any]) -> str:
    """The TUI's validation layer: what its launch form shows is this ConfigError's text."""
    with pytest.raises(ConfigError) as err:
        cfg = parse_train_config(case["flags"])
        spec = LaunchSpec(**case["spec"])
        build_slurm_script(spec, cfg) if case.get("call") == "slurm" else build_launch(spec, cfg)
    return str(err.value)


def _run_cli_case(case: dict[str, Any], places: dict[str, str], work: Path) -> str:
    module = MODULES[case["cli"]]
    env = {
        "LR_CACHE_DIR": str(work / "cache"),
        "HF_HOME": str(work / "hf_home"),
        "HF_TOKEN": PLANTED_TOKEN,
        "HF_ENDPOINT": "http://127.0.0.1:9",
        **case.get("env", {}),
    }
    proc = run_cli([module, *(_fill(a, places) for a in case["argv"])], env=env, cwd=work, timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode == case.get("exit", 2), output[-3000:]
    return output


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_is_refused_cleanly(case: dict[str, Any], request: pytest.FixtureRequest, tmp_path: Path) -> None:
    base = tmp_path / "base"
    _make_base(request, case.get("base"), base)
    for op in case.get("break", []):
        _apply(request, base, op)
    places = {"base": str(base), "tmp": str(tmp_path)}
    before = tree_digest(tmp_path)

    output = _run_tui_case(case) if case["cli"] == "tui" else _run_cli_case(case, places, tmp_path)

    assert _fill(case["expect"], places) in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert tree_digest(tmp_path) == before



def test_engine_refuses_a_bad_flag_before_importing_torch() -> None:
    """The engine's flag and value refusals above cost no torch import (half a second, not several)."""
    code = "import sys; from lr_engine.cli import run; rc = run(['train', '--steps=0']); sys.exit(3 if 'torch' in sys.modules else rc)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr

def test_reliability_page_is_current() -> None:
    """RELIABILITY.md is what tools/reliability_table.py renders from this suite (regenerate it with that tool)."""
    import importlib.util

    tool = Path(__file__).parent.parent / "tools" / "reliability_table.py"
    spec = importlib.util.spec_from_file_location("reliability_table", tool)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    assert len({c["id"] for c in CASES}) == len(CASES) >= 60
    assert (tool.parent.parent / "RELIABILITY.md").read_text() == module.render()
