"""The layout rules of docs/design.md: import names, no stdlib shadowing, imports pointing one way."""

import ast
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.conftest import ROOT

FORBIDDEN_IN_PURE = {"ray", "vllm", "mlflow", "workflows", "envs", "predictors"}
PURE = [
    "platform/tracerl/algos",
    "platform/tracerl/engine",
    "platform/tracerl/tree.py",
    "platform/tracerl/types.py",
    "platform/tracerl/config.py",
    "platform/tracerl/registry.py",
    "platform/tracerl/env_registry.py",
    "platform/tracerl/predictor.py",
]
UPPER_LAYERS = {"envs", "predictors", "workflows"}


def layer(module: str, names: Sequence[str] = ()) -> set[str]:
    """The layers an import of ``module`` (``from module import names``) reaches: ``tracerl.envs.x`` -> envs,
    ``tracerl.workflows`` -> workflows, ``from tracerl import predictors`` -> predictors, ``tracerl.x`` -> tracerl,
    anything else its top-level name."""
    parts = module.split(".")
    if parts[0] != "tracerl":
        return {parts[0]}
    if len(parts) > 1 and parts[1] in UPPER_LAYERS:
        return {parts[1]}
    named = {n for n in names if n in UPPER_LAYERS} if len(parts) == 1 else set()
    return named or {"tracerl"}


def imports(path: Path) -> set[str]:
    """The layers ``path`` imports anywhere (module level, function-local, under TYPE_CHECKING): ``layer``."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out |= layer(a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= layer(node.module, [a.name for a in node.names])
    return out


def raw_imports(path: Path) -> set[str]:
    """The top-level names ``path`` imports, as written."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def files(rel: str) -> list[Path]:
    """The modules under ``rel`` (``rglob`` does not follow the links platform/tracerl/{envs,predictors,workflows})."""
    p = ROOT / rel
    return sorted(p.rglob("*.py")) if p.is_dir() else [p]


def _fresh_python(code: str) -> str:
    """What ``code`` prints in a fresh interpreter started in the repository root."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def test_import_platform_is_the_stdlib_from_the_repo_root() -> None:
    assert not (ROOT / "platform" / "__init__.py").exists()
    out = _fresh_python(
        "import platform, sys; print(platform.__file__); print(platform.python_version())"
    ).split()
    assert not out[0].startswith(str(ROOT)) and out[1].count(".") == 2


def test_packages_import_by_their_design_names() -> None:
    """One top-level import name: envs/, predictors/ and workflows/ stay at the repository's top and import as
    ``tracerl.envs``, ``tracerl.predictors`` and ``tracerl.workflows`` (links in platform/tracerl/)."""
    import tracerl
    from tracerl import envs, predictors, workflows

    assert Path(tracerl.__file__).parent == ROOT / "platform" / "tracerl"
    for mod in (envs, predictors, workflows):
        name = mod.__name__.split(".")[-1]
        assert Path(mod.__file__).resolve().parent == ROOT / name
        assert (ROOT / "platform" / "tracerl" / name).resolve() == ROOT / name


def test_every_module_imports_the_upper_layers_under_tracerl() -> None:
    """No module (tests included) imports ``envs``, ``predictors`` or ``workflows`` by their old top-level names:
    a wheel has only ``tracerl``, and one module imported under two names would be two modules."""
    found = [f for rel in ("platform", "envs", "predictors", "workflows", "tests") for f in files(rel)]
    bad = {str(f.relative_to(ROOT)): sorted(raw_imports(f) & UPPER_LAYERS) for f in found}
    assert {k: v for k, v in bad.items() if v} == {}


def test_pure_core_never_imports_ray_vllm_mlflow_or_upper_layers() -> None:
    bad = {str(f.relative_to(ROOT)): imports(f) & FORBIDDEN_IN_PURE for rel in PURE for f in files(rel)}
    assert {k: v for k, v in bad.items() if v} == {}


def test_envs_and_predictors_do_not_import_workflows_or_ray() -> None:
    for rel in ["envs", "predictors", "platform/tracerl"]:
        for f in files(rel):
            # tracerl.actors are the thin Ray adapters (docs/design.md); nothing in tracerl wires workflows or MLflow
            banned = {"workflows", "mlflow"} if "actors" in f.parts else {"workflows", "ray", "mlflow"}
            assert not imports(f) & banned, f


def test_nothing_in_platform_imports_the_layers_above() -> None:
    """platform/ is the bottom layer: it names the built-in environments and predictors as lazy 'module:attr'
    registry entries (tracerl.env_registry, tracerl.predictor) and never imports envs, predictors or workflows."""
    found = files("platform")
    assert ROOT / "platform/tracerl/config_checks.py" in found and len(found) > 50
    bad = {str(f.relative_to(ROOT)): sorted(imports(f) & UPPER_LAYERS) for f in found}
    assert {k: v for k, v in bad.items() if v} == {}


def test_console_script_points_at_workflows() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'tracerl = "tracerl.workflows.cli.app:main"' in text


def test_default_suite_never_imports_vllm() -> None:
    out = _fresh_python(
        "import sys, tracerl.samplers, tracerl.workflows.lm.stack; print('vllm' in sys.modules)"
    ).strip()
    assert out == "False"


def _rooms_imported(path: Path) -> set[str]:
    """The workflows rooms a module imports (every import, function-local ones too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + (
                [f"{node.module}.{a.name}" for a in node.names] if node.module == "tracerl.workflows" else []
            )
        for n in names:
            parts = n.split(".")
            if parts[:2] == ["tracerl", "workflows"] and len(parts) > 2:
                out.add(parts[2])
    return out


def test_workflows_rooms_import_one_way() -> None:
    from tracerl.workflows import ROOMS

    found = {p.name for p in (ROOT / "workflows").iterdir() if (p / "__init__.py").is_file()}
    assert found == set(ROOMS), (
        "a room of workflows/ is missing from tracerl.workflows.ROOMS (or the reverse)"
    )
    assert sorted(p.name for p in (ROOT / "workflows").glob("*.py")) == ["__init__.py"], (
        "modules live in rooms"
    )
    bad = {}
    for i, room in enumerate(ROOMS):
        allowed = set(ROOMS[: i + 1]) | {"ROOMS", "COMMAND_ROOMS", "COMMAND_FAMILIES"}
        for f in files(f"workflows/{room}"):
            up = _rooms_imported(f) - allowed
            if up:
                bad[str(f.relative_to(ROOT))] = sorted(up)
    assert bad == {}


def test_no_command_room_imports_or_names_the_experiments() -> None:
    """The experiments (``bench peer``, ``bench limit``, the pipeline scale model) sit behind one boundary: no command
    room imports them, and outside their room only ``tracerl.workflows.COMMAND_FAMILIES`` names them (the CLI loads
    them from there, workflows/cli/families.py); nothing below workflows names them either."""
    from tracerl.workflows import COMMAND_FAMILIES, COMMAND_ROOMS, ROOMS

    assert (*COMMAND_ROOMS, "experiments") == ROOMS
    imported = {
        str(f.relative_to(ROOT)): "experiments" in _rooms_imported(f)
        for room in COMMAND_ROOMS
        for f in files(f"workflows/{room}")
    }
    assert [k for k, v in imported.items() if v] == []
    outside = [f for rel in ("platform", "envs", "predictors", "workflows") for f in files(rel)]
    naming = [
        str(f.relative_to(ROOT))
        for f in outside
        if "experiments" not in f.parts and "workflows.experiments" in f.read_text()
    ]
    assert naming == ["workflows/__init__.py"]
    assert list(COMMAND_FAMILIES.values()) == ["tracerl.workflows.experiments.commands:FAMILY"]


PLATFORM_ORDER: list[set[str]] = [
    {
        "__init__",
        "types",
        "tree",
        "tree_io",
        "schema",
        "registry",
        "metrics",
        "shipped",
        "config_yaml",
        "grading",
        "env_config",
    },
    {"algos"},
    {"predictor"},
    {"engine"},
    {"models"},
    {"samplers"},
    {"env_registry"},
    {"calibration"},
    {"actors"},
    {"learner"},
    {"config"},
    {"config_checks"},
    {"config_loader"},
]
"""docs/design.md's order of the platform's folders and top-level modules: each imports only those before it (and
itself). The component schemas (``SCHEMAS``) sit in the first layer with the records, whatever folder holds them."""
SCHEMAS = {"algos.config", "engine.config", "models.config", "actors.config", "env_config"}


def _platform_unit(dotted: str) -> str:
    """The layer name of ``tracerl.<dotted>``: a component schema module counts as the first layer."""
    parts = dotted.split(".")
    if ".".join(parts[:2]) in SCHEMAS or parts[0] in SCHEMAS:
        return "__init__"
    return parts[0]


def test_platform_imports_point_down_its_order() -> None:
    rank = {unit: i for i, layer in enumerate(PLATFORM_ORDER) for unit in layer}
    base = ROOT / "platform" / "tracerl"
    units = {p.name.removesuffix(".py") for p in base.iterdir() if p.suffix == ".py" or p.is_dir()}
    units -= UPPER_LAYERS | {"share", "__pycache__"}
    assert units == set(rank), "a platform folder or module is missing from PLATFORM_ORDER (or the reverse)"
    bad = []
    for path in sorted(base.rglob("*.py")):  # rglob does not follow the links to the upper layers
        rel = path.relative_to(base).with_suffix("")
        own = rank[_platform_unit(".".join(rel.parts))]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                parts = node.module.split(".")
                targets = [n.name for n in node.names] if parts == ["tracerl"] else [".".join(parts[1:])]
                targets = targets if parts[0] == "tracerl" else []
            elif isinstance(node, ast.Import):
                targets = [a.name.partition(".")[2] for a in node.names if a.name.startswith("tracerl.")]
            for t in targets:
                if (
                    t.split(".")[0] in UPPER_LAYERS
                    or t.split(".")[0] not in rank
                    and _platform_unit(t) not in rank
                ):
                    continue
                if rank[_platform_unit(t)] > own:
                    bad.append(f"{rel}: tracerl.{t}")
    assert bad == []


def _module_exists(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent that is a module, not a package
        return False


def test_every_tracerl_import_names_a_module_or_attribute_that_exists() -> None:
    """mypy ignores missing imports (third-party stubs), so a first-party import of a moved module would pass it: every
    ``tracerl.*`` import anywhere in the code (function-local ones too) resolves here."""
    import importlib

    missing = []
    for rel in ("platform/tracerl", "workflows", "envs", "predictors", "tests"):
        for path in files(rel):
            where = path.relative_to(ROOT)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names if a.name.startswith("tracerl")]
                    missing += [f"{where}: {n}" for n in names if not _module_exists(n)]
                if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                    continue
                if not node.module.startswith("tracerl"):
                    continue
                if not _module_exists(node.module):
                    missing.append(f"{where}: {node.module}")
                    continue
                try:
                    mod = importlib.import_module(node.module)
                except ImportError as exc:  # an optional third-party dependency (vllm, trl) is not installed
                    assert not (exc.name or "").startswith("tracerl"), f"{where}: {exc}"
                    continue
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if a.name != "*" and not hasattr(mod, a.name) and not _module_exists(full):
                        missing.append(f"{where}: {full}")
    assert missing == []


def test_every_command_schema_lives_in_its_room_s_config_module() -> None:
    """The rule for command schemas (issue 40): a room's commands' ``*Config`` dataclasses are in its ``config.py``; the
    platform holds the schemas the engine and the training step read (``tracerl.config`` and the component modules)."""
    import ast

    stray = []
    for path in sorted((ROOT / "workflows").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Config") and path.name != "config.py":
                stray.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert stray == []


def _function_local_imports_without_a_why(path: Path) -> list[int]:
    """Lines of ``path``'s imports that sit in a function (or class) body with no comment on their lines, on the
    line above, or above the first import of the run of consecutive imports they belong to."""
    import io
    import tokenize

    src = path.read_text()
    comments = {
        t.start[0] for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.COMMENT
    }
    tree = ast.parse(src)
    top = {id(n) for n in tree.body}
    first_of: dict[int, ast.stmt] = {}
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody", "handlers"):
            stmts = getattr(node, name, None)
            if not isinstance(stmts, list):
                continue
            first: ast.stmt | None = None
            for s in stmts:
                first = (first or s) if isinstance(s, (ast.Import, ast.ImportFrom)) else None
                if first is not None:
                    first_of[id(s)] = first
    bad = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top:
            lines = set(range(n.lineno, (n.end_lineno or n.lineno) + 1))
            lines |= {n.lineno - 1, first_of.get(id(n), n).lineno - 1}
            if not lines & comments:
                bad.append(n.lineno)
    return bad


def test_function_local_imports_in_the_command_rooms_say_why() -> None:
    """Imports sit at the top of a module (docs/design.md); one kept in a function of a command room says why in a
    comment (slow to import, optional, CLI start-up)."""
    from tracerl.workflows import COMMAND_ROOMS

    bad = {
        str(f.relative_to(ROOT)): lines
        for room in COMMAND_ROOMS
        for f in files(f"workflows/{room}")
        if (lines := _function_local_imports_without_a_why(f))
    }
    assert bad == {}
