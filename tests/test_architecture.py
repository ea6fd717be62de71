"""The import graph follows docs/architecture.md: imports point one way, and each package
declares exactly the distributions it imports.

    lr-config  <-  lr-checkpoint  <-  lr-publish
        ^               ^                 ^
        +----------- lr-engine -----------+
    lr-tui  ->  lr-config, light parts of lr-checkpoint
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "lr_config": ROOT / "packages" / "lr-config",
    "lr_checkpoint": ROOT / "packages" / "lr-checkpoint",
    "lr_publish": ROOT / "packages" / "lr-publish",
    "lr_engine": ROOT / "packages" / "lr-engine",
    "lr_tui": ROOT / "apps" / "lr-tui",
}
ALLOWED = {
    "lr_config": set(),
    "lr_checkpoint": {"lr_config"},
    "lr_publish": {"lr_config", "lr_checkpoint"},
    "lr_engine": {"lr_config", "lr_checkpoint", "lr_publish"},
    "lr_tui": {"lr_config", "lr_checkpoint"},
}
# import name -> distribution name, where they differ
DISTRIBUTION = {"PIL": "pillow", "huggingface_hub": "huggingface-hub", "yaml": "pyyaml"}


def imported_modules(package: str) -> dict[str, set[Path]]:
    """Top-level module -> the source files importing it (absolute imports only)."""
    found: dict[str, set[Path]] = {}
    for path in (PACKAGES[package] / "src" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(path)
    return found


def declared(package: str) -> set[str]:
    project = tomllib.loads((PACKAGES[package] / "pyproject.toml").read_text())["project"]
    names = set()
    for dep in project.get("dependencies", []):
        name = dep.split(";")[0]
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        names.add(name.strip().lower().replace("_", "-"))
    return names


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_imports_point_one_way(package: str) -> None:
    ours = {m for m in imported_modules(package) if m in PACKAGES and m != package}
    assert ours <= ALLOWED[package], f"{package} imports {sorted(ours - ALLOWED[package])} against docs/architecture.md"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_dependencies_are_exactly_what_is_imported(package: str) -> None:
    third_party = {
        m for m in imported_modules(package) if m not in sys.stdlib_module_names and m != package and not m.startswith("_")
    }
    needed = {DISTRIBUTION.get(m, m).lower().replace("_", "-") for m in third_party}
    assert needed == declared(package), f"{package}: imports need {sorted(needed)}, pyproject declares {sorted(declared(package))}"


def test_lr_config_needs_only_cattrs() -> None:
    assert declared("lr_config") == {"cattrs"}


def test_tui_and_config_never_import_torch_in_source() -> None:
    for package in ("lr_config", "lr_tui"):
        assert "torch" not in imported_modules(package), package


_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *(p / "README.md" for p in PACKAGES.values())]
_PATHISH = re.compile(r"`((?:packages|apps|tests|tools|docs)/[A-Za-z0-9_./-]+)`|\]\(((?:\.\./)?[A-Za-z0-9_./-]+\.md)\)")


def _named_paths(doc: Path) -> list[Path]:
    """Repository paths a doc names: `packages/...`-style code spans and relative .md links."""
    found = []
    for code, link in _PATHISH.findall(doc.read_text()):
        if code:  # from the repository's root, or (in a package's README) from the package's folder
            path = ROOT / code.rstrip("/.")
            found.append(path if path.exists() else doc.parent / code.rstrip("/."))
        else:
            found.append((doc.parent / link).resolve())
    return found


@pytest.mark.parametrize("doc", _DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    missing = [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in _named_paths(doc) if not p.exists()]
    assert missing == [], f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_nothing_in_the_repo_points_outside_it() -> None:
    """The design lives in docs/: no file may send a reader to documents a clone does not have."""
    outside = re.compile(r"\.\./shared|\bFACTS\.md|(?<![/\w])ARCHITECTURE\.md|\bSTYLE\.md")
    offenders = []
    for path in ROOT.rglob("*"):
        if path.suffix in (".py", ".md", ".toml", ".sh") and ".venv" not in path.parts and ".git" not in path.parts and path.is_file():
            if outside.search(path.read_text(errors="replace")):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


_SOURCES = sorted(p for root in (*PACKAGES.values(), ROOT / "tools") for p in root.rglob("*.py") if "tests" not in p.relative_to(root).parts)
_LAYOUT_MODULE = PACKAGES["lr_config"] / "src" / "lr_config" / "layout.py"


def _layout_names() -> dict[str, str]:
    """The names `lr_config.layout` defines: NAME -> "spelling"."""
    tree = ast.parse(_LAYOUT_MODULE.read_text())
    return {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper()
        and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """The string literals of a module, docstrings aside."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_the_checkpoint_layout_is_spelled_in_one_module() -> None:
    """Folder names of a checkpoint appear in no literal outside lr_config/layout.py (messages
    included: they interpolate the names), and no path is joined with a literal layout name
    (`run / "checkpoints"`); every layout name is defined there once."""
    names = _layout_names()
    assert {"CHECKPOINTS", "LAST", "PRETRAINED", "TRAINING_STATE", "MODEL_DCP", "OPTIMIZER_DCP", "TRAIN_CONFIG"} <= set(names)
    assert len(set(names.values())) == len(names), names
    folders = [names[n] for n in ("PRETRAINED", "TRAINING_STATE", "MODEL_DCP", "OPTIMIZER_DCP")]
    spelled, joined = [], []
    for path in _SOURCES:
        if path == _LAYOUT_MODULE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        where = lambda node: f"{path.relative_to(ROOT)}:{node.lineno}"  # noqa: E731
        spelled += [f"{where(n)} {n.value[:60]!r}" for n in _strings(tree) if any(f in n.value for f in folders)]
        joined += [
            f"{where(n)} / {side.value!r}"
            for n in ast.walk(tree)
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
            for side in (n.left, n.right)
            if isinstance(side, ast.Constant) and side.value in names.values()
        ]
    assert spelled == [], "checkpoint folder names spelled outside lr_config/layout.py:\n" + "\n".join(spelled)
    assert joined == [], "paths joined with a literal layout name (use lr_config.layout):\n" + "\n".join(joined)


def _module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (at the top, in a function, or for
    type checking alike), by dotted name."""
    root = PACKAGES[package] / "src" / package
    modules = {}
    for path in root.rglob("*.py"):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""]).strip(".") if node.level else node.module or ""
                # `from pkg import mod` imports the module `pkg.mod`; `from pkg import name`, the
                # package's `__init__` (a parent package is imported on the way, as for any import)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            graph[name] |= {t for t in targets if t in modules and t not in (name, package)}
    return graph


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_circles_inside_a_package(package: str) -> None:
    graph = _module_graph(package)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(graph[node])
        return False

    circles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})
    assert circles == [], f"{package}: modules that import each other (directly or around a circle): {circles}"


def test_the_module_walk_resolves_relative_imports_in_sub_packages() -> None:
    """The circle check sees imports between sub-packages (`..fast_paths`, `..._io.hashing`)
    as edges to those modules, and an empty sub-package `__init__` as a module of its own."""
    graph = _module_graph("lr_checkpoint")
    assert {"lr_checkpoint._formats", "lr_checkpoint._formats.dcp"} <= set(graph)
    assert {"lr_checkpoint._formats.fast_paths", "lr_checkpoint._formats.dcp.metadata"} <= graph["lr_checkpoint._formats.dcp.read"]
    assert "lr_checkpoint._io.hashing" in graph["lr_checkpoint._formats.safetensors.read"]
    assert "lr_checkpoint._formats.dcp.stream" in graph["lr_checkpoint._convert"]


def test_lr_checkpoint_rooms_import_one_way() -> None:
    """lr-checkpoint's sub-packages form no circle between them: `_io` (bytes to disk), then
    `_formats` (the files, byte by byte), then `_state` (the training side); the verbs at the
    top use them all, and a room uses no verb (only the shared `_ranks` and `_request`). A room
    importing a room above it would make a circle of rooms even where no two modules do."""
    rooms = ["lr_checkpoint._io", "lr_checkpoint._formats", "lr_checkpoint._state"]
    shared = {"lr_checkpoint", "lr_checkpoint._ranks", "lr_checkpoint._request"}

    def level(module: str) -> int:
        """0, 1, 2 for the rooms; 3 for a verb at the top (what no room may import)."""
        return next((i for i, r in enumerate(rooms) if module == r or module.startswith(r + ".")), len(rooms))

    upward = sorted(
        (a, b)
        for a, targets in _module_graph("lr_checkpoint").items()
        if level(a) < len(rooms)
        for b in targets
        if b not in shared and level(b) > level(a)
    )
    assert upward == [], f"rooms importing a room above them, or a verb: {upward}"
