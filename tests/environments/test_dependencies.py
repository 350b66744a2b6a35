"""`environments` imports nothing from `ragen_jax` (docs/architecture.md#layout): the dependency points one way."""
import ast
import pathlib

import environments


def _imported_modules(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module)
    return names


def test_environments_import_nothing_from_ragen_jax():
    root = pathlib.Path(environments.__file__).parent
    offenders = [f"{path.relative_to(root)}: {name}"
                 for path in sorted(root.rglob("*.py"))
                 for name in _imported_modules(ast.parse(path.read_text(encoding="utf-8")))
                 if name.split(".")[0] == "ragen_jax"]
    assert not offenders
