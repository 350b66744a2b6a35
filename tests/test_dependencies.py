"""The import DAG of docs/architecture.md#layers: every import of the project's own code, at module level or inside a
function, points to its own layer or a lower one."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# docs/architecture.md#layers, lowest first; a unit is a top-level package, or a subpackage / module of ragen_jax
LAYERS = (
    ("environments",),
    ("ragen_jax.errors", "ragen_jax.compile_cache", "ragen_jax.distributed", "ragen_jax.defaults"),
    ("ragen_jax.config",),
    ("ragen_jax.sharding",),
    ("ragen_jax.models",),
    ("ragen_jax.filtering",),
    ("ragen_jax.algos", "ragen_jax.rollout"),
    ("ragen_jax.diagnostics",),
    ("ragen_jax.train", "ragen_jax.metrics", "ragen_jax.workdir"),
    ("configs",),
    ("experiments",),
)
RANK = {unit: rank for rank, layer in enumerate(LAYERS) for unit in layer}


def unit_of(module: str) -> str | None:
    """The layer unit of a dotted module name (None for code outside the project)."""
    parts = module.split(".")
    if parts[0] == "ragen_jax" and len(parts) > 1:
        return f"ragen_jax.{parts[1]}"
    return parts[0] if parts[0] in RANK else None


def imported_modules(source: str) -> list[str]:
    """Every module an absolute import in `source` names; `from package import name` also names package.name,
    which may be a submodule."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def upward_imports(root: pathlib.Path) -> list[str]:
    """"path: importer -> imported" for each import in the project's packages under `root` that points to a higher
    layer (or to a unit missing from LAYERS)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        source = unit_of(module)
        if source is None:
            continue
        for name in imported_modules(path.read_text(encoding="utf-8")):
            target = unit_of(name)
            if target is None or target == source or name == "ragen_jax":
                continue
            if source not in RANK or target not in RANK or RANK[target] > RANK[source]:
                found.append(f"{path.relative_to(root)}: {source} -> {target}")
    return sorted(set(found))


def test_every_import_points_down_the_documented_layers():
    units = {unit_of(".".join(p.relative_to(ROOT).with_suffix("").parts))
             for package in ("ragen_jax", "environments", "configs", "experiments")
             for p in (ROOT / package).rglob("*.py")}
    assert units - {None, "ragen_jax.__init__"} <= set(RANK)  # every unit has its layer
    assert upward_imports(ROOT) == []


def test_an_upward_import_is_caught(tmp_path):
    models = tmp_path / "ragen_jax" / "models"
    models.mkdir(parents=True)
    (models / "lm.py").write_text("import jax\n\ndef f():\n    from ragen_jax.train import step\n")
    (tmp_path / "environments").mkdir()
    (tmp_path / "environments" / "base.py").write_text("from ragen_jax import sharding\nimport numpy\n")
    (tmp_path / "ragen_jax" / "algos").mkdir()
    (tmp_path / "ragen_jax" / "algos" / "scoring.py").write_text("from ragen_jax.models import lm\n")  # downward
    assert upward_imports(tmp_path) == ["environments/base.py: environments -> ragen_jax.sharding",
                                        "ragen_jax/models/lm.py: ragen_jax.models -> ragen_jax.train"]
