"""Docstring and comment lines per line of code in a Python tree (default: iris/), overall and per file.

A non-blank line counts as documentation when it lies inside a docstring (a string standing alone as the first
statement of a module, class or function) or is a comment on a line of its own; code is every other non-blank line. A
comment at the end of a line of code counts that line as code only.

Usage:
    python .ci/doc_ratio.py            # the ratio over iris/
    python .ci/doc_ratio.py --files    # and each file's, highest first
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def docstring_lines(tree: ast.Module) -> set[int]:
    """The line numbers of every module, class and function docstring in ``tree``."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def count(path: Path) -> tuple[int, int]:
    """(documentation lines, code lines) of one file."""
    source = path.read_text()
    docs = docstring_lines(ast.parse(source))
    comments, code = set(), set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments.add(token.start[0])
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                tokenize.ENDMARKER, tokenize.ENCODING):
            code.update(range(token.start[0], token.end[0] + 1))
    code -= docs
    text = source.splitlines()
    documentation = {n for n in docs if text[n - 1].strip()} | (comments - code)
    return len(documentation), len(code)


def ratio(tree: Path = ROOT / "iris") -> tuple[float, list[tuple[str, int, int]]]:
    """The tree's documentation lines per code line, and each file's counts."""
    rows = [(str(p.relative_to(ROOT)), *count(p)) for p in sorted(tree.rglob("*.py"))]
    docs, code = sum(r[1] for r in rows), sum(r[2] for r in rows)
    return docs / max(code, 1), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", default=str(ROOT / "iris"))
    parser.add_argument("--files", action="store_true", help="each file's ratio too, highest first")
    args = parser.parse_args()
    value, rows = ratio(Path(args.tree).resolve())
    if args.files:
        for name, docs, code in sorted(rows, key=lambda r: -r[1] / max(r[2], 1)):
            print(f"{docs / max(code, 1):5.2f}  {docs:5d} / {code:5d}  {name}")
    print(f"documentation lines per code line: {value:.3f} ({sum(r[1] for r in rows)} / {sum(r[2] for r in rows)})")


if __name__ == "__main__":
    main()
