"""Policy plugins that break the rules (docs/plugins.md) get a start-up error naming the plugin.

Each case is an installed distribution made in a temporary folder (a `.dist-info` with its
`entry_points.txt`, beside its module), found through `sys.path` / PYTHONPATH as any
installed package is. The lr-config cases run in this process (discovery imports no torch);
the engine's own checks and the exit code run the real CLI. The example plugin that follows
the rules is tested in examples/lr-tinyformer/tests.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from lr_config import ConfigError, parse_train_config, policy_types

from _support.procs import run_cli

GOOD_CONFIG = '''
from dataclasses import dataclass, field
from typing import ClassVar
from lr_config import PolicyConfigBase, doc

@dataclass
class Config(PolicyConfigBase):
    type_name: ClassVar[str] = "{name}"
    policy_class: ClassVar[str] = "{module}:Net"
    chunk_size: int = doc(1, "Actions per step.")
    n_action_steps: int = doc(1, "Actions run per chunk.")
'''


def install(site: Path, dist: str, name: str, module: str, source: str) -> None:
    """A distribution `dist` declaring policy `name` = `module`:Config, with `module`'s source."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[lr.policies]\n{name} = {module}:Config\n")
    (site / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


def refusal() -> str:
    with pytest.raises(ConfigError) as err:
        parse_train_config([])
    return str(err.value)


def test_a_plugin_named_as_a_built_in_is_refused(site: Path) -> None:
    install(site, "lr-clash", "act", "lr_clash_act", GOOD_CONFIG.format(name="act", module="lr_clash_act"))
    message = refusal()
    assert "policy plugin 'act'" in message and "of lr-clash" in message and "is a built-in policy type" in message


def test_two_plugins_with_one_name_are_refused(site: Path) -> None:
    install(site, "lr-tiny-again", "tinyformer", "lr_tiny_again", GOOD_CONFIG.format(name="tinyformer", module="lr_tiny_again"))
    message = refusal()
    assert "the policy type 'tinyformer' is also declared by" in message and "uninstall one of them" in message


def test_a_plugin_that_fails_to_import_is_named(site: Path) -> None:
    install(site, "lr-broken", "broken", "lr_broken_cfg", "import a_module_that_is_not_installed\n")
    message = refusal()
    assert "policy plugin 'broken' (lr_broken_cfg:Config" in message and "of lr-broken" in message
    assert "importing it failed (ModuleNotFoundError: No module named 'a_module_that_is_not_installed')" in message


@pytest.mark.parametrize(
    "source,expected",
    [
        ("Config = dict\n", "must name a dataclass that subclasses lr_config.PolicyConfigBase"),
        (GOOD_CONFIG.format(name="other", module="{m}"), "Config.type_name is 'other'; it must be the entry point's name, 'odd'"),
        (GOOD_CONFIG.format(name="odd", module="{m}").replace('"{m}:Net"', '"Net"'), 'must declare policy_class = "module:Class"'),
        (GOOD_CONFIG.format(name="odd", module="{m}").replace("    chunk_size: int", "    chunks: int"), "lacks the field(s) chunk_size"),
        (GOOD_CONFIG.format(name="odd", module="{m}") + "    width: int = field(kw_only=True)\n", "Config() failed"),
        (GOOD_CONFIG.format(name="odd", module="{m}") + "    when: object = doc(None, 'x')\n", "do not go through lr's config files"),
    ],
    ids=["not-a-config", "type-name", "no-policy-class", "no-chunk-size", "no-default", "not-json"],
)
def test_a_plugin_config_that_breaks_the_contract_is_refused(site: Path, source: str, expected: str, request: pytest.FixtureRequest) -> None:
    module = f"lr_odd_{request.node.callspec.id.replace('-', '_')}"
    install(site, "lr-odd", "odd", module, source.replace("{m}", module))
    assert expected in refusal()


def test_the_plugins_are_found_again_when_the_path_changes(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(site, "lr-fine", "fine", "lr_fine_cfg", GOOD_CONFIG.format(name="fine", module="lr_fine_cfg"))
    assert "fine" in policy_types()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(site)])
    assert "fine" not in policy_types() and "tinyformer" in policy_types()


NET = '''
from typing import ClassVar
from lr_engine import Policy
from {config_module} import Config

class Net(Policy):
    config_class: ClassVar[type] = Config
    name: ClassVar[str] = "{name}"
'''


def test_a_policy_without_its_fsdp_declarations_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install(site, "lr-undeclared", "undeclared", "lr_undeclared", GOOD_CONFIG.format(name="undeclared", module="lr_undeclared_net"))
    (site / "lr_undeclared_net.py").write_text(textwrap.dedent(NET.format(config_module="lr_undeclared", name="undeclared")))
    out = tmp_path / "run"
    proc = run_cli(["lr_engine.cli", "train", "--policy.type=undeclared", "--steps=1", f"--output_dir={out}"], env={"PYTHONPATH": str(site)})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "policy plugin 'undeclared': policy_class 'lr_undeclared_net:Net' does not declare _fsdp_wrap_modules and _fsdp_forward_methods" in proc.stderr
    assert not out.exists()


def test_a_broken_plugin_exits_2_without_a_traceback(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install(site, "lr-broken", "broken", "lr_broken_cli", "raise RuntimeError('the plugin is broken')\n")
    proc = run_cli(["lr_engine.cli", "train", "--help"], env={"PYTHONPATH": str(site)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "importing it failed (RuntimeError: the plugin is broken); fix or uninstall lr-broken" in proc.stderr
