"""Bug injection by small AST mutations, applied as minimal text edits, and unified diffs.

A mutation is found on the AST but applied to the source text at the node's exact position, so
the rest of the file keeps its formatting and the gold patch (the reverse edit) is a one-hunk
diff. Operators: flipped comparison, wrong arithmetic operator, off-by-one / changed constant,
flipped boolean constant, ``and``/``or`` swap, dropped ``not``, swapped call arguments,
``+=``/``-=`` swap.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass

_COMPARE_FLIP = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}
_BINOP_SWAP = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "+"),
    ast.FloorDiv: ("//", "*"),
    ast.Mod: ("%", "//"),
}
_AUG_SWAP = {ast.Add: ("+=", "-="), ast.Sub: ("-=", "+=")}
_BOOL_SWAP = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


@dataclass(frozen=True)
class Mutation:
    kind: str
    start: int
    """Character offset of the replaced text in the original source."""
    end: int
    old: str
    new: str
    function: str
    """Qualified name of the enclosing function (``Class.method`` or ``func``)."""
    lineno: int

    def apply(self, source: str) -> str:
        assert source[self.start : self.end] == self.old
        return source[: self.start] + self.new + source[self.end :]


class _Offsets:
    """(lineno, col_offset in UTF-8 bytes) -> character offset into the source."""

    def __init__(self, source: str) -> None:
        self.lines = split_lines(source)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def __call__(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode()[:col].decode(errors="ignore"))


def _span(off: _Offsets, node: ast.AST) -> tuple[int, int]:
    return off(node.lineno, node.col_offset), off(node.end_lineno, node.end_col_offset)


def _between(source: str, off: _Offsets, left: ast.AST, right: ast.AST, token: str) -> tuple[int, int] | None:
    """The span of ``token`` between two nodes, when it is the only thing there (bar parens, spaces)."""
    a = off(left.end_lineno, left.end_col_offset)
    b = off(right.lineno, right.col_offset)
    gap = source[a:b]
    m = re.fullmatch(r"([\s()\\]*)" + re.escape(token).replace(r"\ ", r"\s+") + r"([\s()\\]*)", gap)
    if m is None:
        return None
    return a + m.end(1), b - len(m.group(2))


def find_mutations(source: str) -> list[Mutation]:
    """Every mutation site inside a function body of ``source`` (docstrings excluded)."""
    tree = ast.parse(source)
    off = _Offsets(source)
    found: list[Mutation] = []

    def visit_function(fn: ast.AST, qualname: str) -> None:
        body = list(fn.body)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        for stmt in body:
            for node in ast.walk(stmt):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                    continue
                found.extend(_sites(source, off, node, qualname))

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit_function(child, f"{prefix}{child.name}")
                walk(child, f"{prefix}{child.name}.")

    walk(tree, "")
    # Sites of nested functions are visited from the outer walk too: keep one of each.
    unique = {(m.start, m.end, m.new): m for m in found}
    return sorted(unique.values(), key=lambda m: (m.start, m.new))


def _sites(source: str, off: _Offsets, node: ast.AST, fn: str) -> list[Mutation]:
    out: list[Mutation] = []

    def add(kind: str, span: tuple[int, int] | None, new: str) -> None:
        if span is None:
            return
        a, b = span
        out.append(Mutation(kind, a, b, source[a:b], new, fn, node.lineno))

    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE_FLIP:
        old, new = _COMPARE_FLIP[type(node.ops[0])]
        add("flipped comparison", _between(source, off, node.left, node.comparators[0], old), new)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
        old, new = _BINOP_SWAP[type(node.op)]
        add("wrong operator", _between(source, off, node.left, node.right, old), new)
    elif isinstance(node, ast.AugAssign) and type(node.op) in _AUG_SWAP:
        old, new = _AUG_SWAP[type(node.op)]
        add("wrong operator", _between(source, off, node.target, node.value, old), new)
    elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
        old, new = _BOOL_SWAP[type(node.op)]
        add("wrong boolean operator", _between(source, off, node.values[0], node.values[1], old), new)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        a, _ = _span(off, node)
        b = off(node.operand.lineno, node.operand.col_offset)
        if re.fullmatch(r"not\s+", source[a:b]):
            add("dropped negation", (a, b), "")
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        add("changed constant", _span(off, node), str(not node.value))
    elif isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 1000:
        span = _span(off, node)
        if source[span[0] : span[1]] == str(node.value):
            add("off-by-one", span, str(node.value + 1))
            if node.value > 0:
                add("off-by-one", span, str(node.value - 1))
    elif isinstance(node, ast.Call) and len(node.args) >= 2:
        first, second = node.args[0], node.args[1]
        if not any(isinstance(a, ast.Starred) for a in (first, second)):
            (a0, b0), (a1, b1) = _span(off, first), _span(off, second)
            t0, t1 = source[a0:b0], source[a1:b1]
            if t0 != t1 and "\n" not in source[a0:b1]:
                add("swapped arguments", (a0, b1), t1 + source[b0:a1] + t0)
    return out


def is_real_change(source: str, mutated: str) -> bool:
    """The mutated source still parses and means something else."""
    try:
        return ast.dump(ast.parse(source)) != ast.dump(ast.parse(mutated))
    except SyntaxError:
        return False


# ---- unified diffs ----------------------------------------------------------------------------
def split_lines(text: str) -> list[str]:
    """Lines with their ends, split on "\n" only (``str.splitlines`` also splits on form feeds...)."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def make_patch(path: str, before: str, after: str, context: int = 3) -> str:
    """A git-style unified diff of one file (both texts must end with a newline)."""
    if not (before.endswith("\n") and after.endswith("\n")):
        raise ValueError(f"{path}: only files that end with a newline are patched")
    a, b = split_lines(before), split_lines(after)
    out = [f"--- a/{path}\n", f"+++ b/{path}\n"]
    for group in _Matcher(a, b).get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n")
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out += [" " + line for line in a[x1:x2]]
                continue
            out += ["-" + line for line in a[x1:x2]]
            out += ["+" + line for line in b[y1:y2]]
    return "".join(out) if len(out) > 2 else ""


class _Matcher(difflib.SequenceMatcher):
    """Line matching for near-identical files: the common head and tail are cut off first (fast
    on long files), and autojunk is off (difflib's junk heuristic turns a one-line change in a
    long file into huge hunks)."""

    def __init__(self, a: list[str], b: list[str]) -> None:
        super().__init__(None, a, b, autojunk=False)

    def get_opcodes(self) -> list[tuple[str, int, int, int, int]]:
        a, b = self.a, self.b
        head = 0
        while head < min(len(a), len(b)) and a[head] == b[head]:
            head += 1
        tail = 0
        while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
            tail += 1
        middle = difflib.SequenceMatcher(
            None, a[head : len(a) - tail], b[head : len(b) - tail], autojunk=False
        )
        ops = [("equal", 0, head, 0, head)] if head else []
        ops += [(t, i1 + head, i2 + head, j1 + head, j2 + head) for t, i1, i2, j1, j2 in middle.get_opcodes()]
        if tail:
            ops.append(("equal", len(a) - tail, len(a), len(b) - tail, len(b)))
        return ops


def line_opcodes(a: list[str], b: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib-style opcodes turning lines ``a`` into lines ``b``."""
    return _Matcher(a, b).get_opcodes()


def _range(start: int, stop: int) -> str:
    length = stop - start
    first = start + 1 if length else start
    return f"{first}" if length == 1 else f"{first},{length}"


def patch_files(patch: str) -> list[str]:
    return [line[6:].strip() for line in patch.splitlines() if line.startswith("+++ b/")]


def apply_patch(files: dict[str, str], patch: str, reverse: bool = False) -> dict[str, str]:
    """Apply a unified diff to ``files`` (path -> text); returns the changed files. Strict: the
    context and removed lines must match exactly where the hunk header says."""
    out: dict[str, str] = {}
    lines = split_lines(patch)
    i = 0
    path = ""
    shift: dict[str, int] = {}
    while i < len(lines):
        line = lines[i]
        if line.startswith("+++ b/"):
            path = line[6:].strip()
            out[path] = out.get(path, files[path])
            shift.setdefault(path, 0)
        elif line.startswith("@@"):
            m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", line)
            if m is None:
                raise ValueError(f"bad hunk header: {line!r}")
            old_start = int(m.group(3) if reverse else m.group(1))
            body_old: list[str] = []
            body_new: list[str] = []
            i += 1
            while i < len(lines) and lines[i][:1] in (" ", "-", "+"):
                tag, text = lines[i][:1], lines[i][1:]
                if reverse and tag in "+-":
                    tag = "-" if tag == "+" else "+"
                if tag in (" ", "-"):
                    body_old.append(text)
                if tag in (" ", "+"):
                    body_new.append(text)
                i += 1
            cur = split_lines(out[path])
            at = (max(old_start - 1, 0) if body_old else old_start) + shift[path]
            if cur[at : at + len(body_old)] != body_old:
                raise ValueError(f"patch does not apply to {path} at line {old_start}")
            out[path] = "".join(cur[:at] + body_new + cur[at + len(body_old) :])
            shift[path] += len(body_new) - len(body_old)
            continue
        i += 1
    return out
