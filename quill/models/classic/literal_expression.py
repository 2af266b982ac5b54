"""The small Python expressions fairseq keeps as strings in its arguments, read without running them.

fairseq passes `--decoder-layers "[(850, 6)] * 3 + [(1024, 4)]"` to `eval`; a checkpoint's arguments
are data from whoever wrote the file, so Quill parses them (Python's `ast`, which only parses) and
evaluates only lists, tuples, integers, True/False, `+` and `*` itself. Anything else (a name, a call,
an attribute) is refused with the text that was given.
"""

from __future__ import annotations

import ast

MAX_ITEMS = 100_000  # the longest list a repetition may build: no checkpoint has more layers than this


class ExpressionError(ValueError):
    pass


def literal_expression(text: str) -> object:
    """The value of `text`, an expression of int/bool literals, lists, tuples, `+` and `*`."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ExpressionError(f"{text!r} is not an expression") from None
    return _value(tree.body, text)


def _value(node: ast.AST, text: str) -> object:
    if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        return node.value
    if isinstance(node, ast.List):
        return [_value(e, text) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(e, text) for e in node.elts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _value(node.left, text), _value(node.right, text)
        if isinstance(node.op, ast.Add) and type(left) is type(right) and not isinstance(left, bool):
            return left + right
        if isinstance(node.op, ast.Mult):
            if isinstance(right, (list, tuple)):
                left, right = right, left
            if isinstance(left, (list, tuple)) and type(right) is int:
                if len(left) * max(right, 0) > MAX_ITEMS:
                    raise ExpressionError(f"{text!r} builds a list of more than {MAX_ITEMS} items")
                return left * right
            if type(left) is int and type(right) is int:
                return left * right
        raise ExpressionError(f"{text!r}: cannot apply {type(node.op).__name__} to these values")
    raise ExpressionError(f"{text!r} is not a literal expression of lists, tuples and integers "
                          f"(found {type(node).__name__})")
