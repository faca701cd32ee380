"""A content hash of the training code, for the workflow's training rules (their `params:`), so
that Snakemake reruns training when that code changes and not when only report code does.

The hash is over each module's syntax tree with docstrings dropped (`ast.dump` holds neither
comments nor line numbers): a change to a comment, a docstring or the formatting keeps it, any
other change to the code makes a new one. `dvc.yaml`'s training stages depend on the same files
(TRAINING_CODE; tests/test_dvc.py checks the two lists agree).

    python -m incofl.codehash          # the hash of this checkout's training code
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

PACKAGE = Path(__file__).parent
# What `incofl train` runs: the engine, methods, models, data, the random streams, the config
# with the method registry and its parameters, the CLI entry, the numerics pins and their convolutions.
TRAINING_CODE = (
    "fl",
    "models",
    "data",
    "streams.py",
    "config.py",
    "registry.py",
    "spec.py",
    "params.py",
    "errors.py",
    "studies.py",
    "atomic.py",
    "cli.py",
    "numerics.py",
    "portable_conv.py",
)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not body:
            continue
        first = body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return tree


def source_files(names: tuple[str, ...] = TRAINING_CODE, root: Path = PACKAGE) -> list[Path]:
    """The .py files of `names` (modules and packages under `root`), in a fixed order."""
    files = []
    for name in names:
        path = root / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def code_hash(names: tuple[str, ...] = TRAINING_CODE, root: Path = PACKAGE) -> str:
    """sha256 over (relative path, docstring-free syntax tree) of every file of `names`."""
    digest = hashlib.sha256()
    for path in source_files(names, root):
        tree = _without_docstrings(ast.parse(path.read_text(), filename=str(path)))
        digest.update(f"{path.relative_to(root)}\0{ast.dump(tree)}\0".encode())
    return digest.hexdigest()


if __name__ == "__main__":
    print(code_hash())
