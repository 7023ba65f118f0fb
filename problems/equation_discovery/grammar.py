"""What an equation candidate may be: one expression, read by trusted code and written back by it.

A candidate, compact or whole program, is accepted only as straight-line code over the
problem's inputs:

    params[0] * x + params[1] * v ** 3 + params[2] * np.sin(v)        # an expression
    return params[0] * x + params[1] * v                              # `return` is dropped
    a = x * v; y = params[0] * a                                       # the last name bound

    import numpy as np                                                 # a whole program:

    def equation(x: np.ndarray, v: np.ndarray, params: np.ndarray) -> np.ndarray:
        '''A docstring is fine.'''
        cubic = params[1] * v ** 3                                     # assignments, inlined
        return params[0] * x + cubic

An expression holds only the inputs, `params[k]` with a literal k from 0 to 9, number literals
within +-MAX_LITERAL, `np.pi` and `np.e`, the operators + - * / ** (unary - and + too), and the
elementwise numpy functions in FUNCTIONS (`abs(...)` is `np.abs`). A program holds at most
`import numpy as np`, a docstring and `def equation(<the inputs>, params)` whose body is a
docstring, assignments to plain names (`a = ...`, `a += ...`) and one final `return`;
annotations are allowed and dropped. Nothing else: no other import, call, attribute, loop,
comprehension, lambda, decorator, default, helper function or module-level code. Anything else is
refused with a one-line reason that says what to write instead.

The harness then writes the program that is fitted (`EquationDiscovery.compact.program`) from
the parsed expression, its assignments inlined, so no text a candidate wrote runs anywhere: the
sandbox runs the harness's rewriting of it. The same tree gives the size (`Equation.size`) and
the family key (family.py), so every trusted step reads one bounded tree: at most MAX_CHARS
characters of text, MAX_NODES nodes and MAX_DEPTH levels once inlined.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from problems.equation_discovery.readings import assigns, dedented, named_result

MAX_CHARS = 4_000  # a candidate's text; a longer one is a runaway generation
MAX_NODES = 400  # nodes of the inlined expression (an honest ten-term equation has ~60)
MAX_DEPTH = 40  # levels of the inlined expression
MAX_LITERAL = 1e6  # a larger constant belongs in params, where the fit sets it
NPARAMS = 10
HALF = 10  # the size that scores simplicity one half
# numpy's elementwise functions an equation may call, by their number of arguments
FUNCTIONS = {
    **dict.fromkeys(
        (
            "sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
            "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "cbrt", "square",
            "abs", "absolute", "sign",
        ),
        1,
    ),
    **dict.fromkeys(("power", "arctan2", "maximum", "minimum"), 2),
}  # fmt: skip
# as the statement names them (absolute is abs, a builtin `abs(...)` too)
STATED = tuple(sorted(set(FUNCTIONS) - {"absolute"}))
CONSTANTS = ("pi", "e")
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
ALLOWED = "arithmetic (+ - * / **) of the inputs, params[k], numbers and numpy functions (np.exp)"
FUNCTION_LIST = "np." + ", np.".join(STATED)


class Refused(ValueError):
    """A candidate that is not an equation; the message is the one-line reason."""


@dataclass(frozen=True)
class Equation:
    """A candidate read as one expression, its assignments inlined."""

    tree: ast.expr
    text: str  # the expression as `ast.unparse` writes it: the program's `return`
    size: int  # operators + literals + params, each counted once per use (see `size`)


def read(text: str, inputs: tuple[str, ...]) -> Equation:
    """The equation a candidate's text states (see the module); Refused with the reason."""
    if not isinstance(text, str):
        raise Refused("the candidate is not text")
    text = text.strip()
    if not text:
        raise Refused("the candidate is empty")
    if len(text) > MAX_CHARS:
        raise Refused(f"the candidate is over {MAX_CHARS:,} characters: write one expression")
    if "\x00" in text:
        raise Refused("the candidate contains a NUL byte")
    expression = text[len("return") :].strip() if _starts_with_return(text) else text
    tree = _parse(expression, "eval")
    if tree is not None and _deeper_than(tree, MAX_DEPTH + 4):
        raise Refused(f"the equation is nested over {MAX_DEPTH} levels deep")
    if tree is not None:
        assert isinstance(tree, ast.Expression)
        body = _Reader(inputs, {}).expression(tree.body)
    else:
        # a body copied out of `equation` may still be indented
        module = _parse(text, "exec") or _parse(dedented(text), "exec")
        if module is None:
            raise Refused(_syntax_reason(expression))
        assert isinstance(module, ast.Module)
        if _deeper_than(module, MAX_DEPTH + 10):
            raise Refused(f"the program is nested over {MAX_DEPTH} levels deep")
        body = _program(module, inputs)
    canonical = ast.unparse(body.tree)
    return Equation(ast.parse(canonical, mode="eval").body, canonical, size(body.tree))


def size(tree: ast.AST) -> int:
    """operators + literals + params of an inlined expression, each once per use: a binary or
    unary operator and a call count 1, a number (a negative one too) or `np.pi` 1, each
    `params[k]` 1, an input 0 (PySR's complexity counts an expression's nodes likewise,
    Cranmer 2023, arXiv 2305.01582)."""
    total = 0
    waiting = [tree]
    while waiting:
        node = waiting.pop()
        if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
            total += 1  # -2.5 is one literal
        elif isinstance(node, ast.Subscript | ast.Constant | ast.Attribute):
            total += 1  # params[k], a number, np.pi
        elif isinstance(node, ast.BinOp | ast.UnaryOp):
            total += 1
            waiting.extend(ast.iter_child_nodes(node))
        elif isinstance(node, ast.Call):
            total += 1
            waiting.extend(node.args)
    return total


def simplicity(size: int | None) -> float:
    """HALF / (HALF + size): 1 for an equation of size 0 (an input returned as it is), one half
    at HALF, never 0, so of two equations the smaller scores more; 0 without a size (a program
    the grammar refuses)."""
    return 0.0 if size is None else HALF / (HALF + size)


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    """A read expression with what bounds it: nodes and depth as if inlined."""

    tree: ast.expr
    nodes: int
    depth: int


def _deeper_than(tree: ast.AST, limit: int) -> bool:
    """Whether the tree has more than `limit` levels, found without recursion (the reader
    recurses, so a tree past Python's recursion limit must never reach it)."""
    waiting = [(tree, 1)]
    while waiting:
        node, depth = waiting.pop()
        if depth > limit:
            return True
        waiting.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return False


def _starts_with_return(text: str) -> bool:
    return text.startswith("return") and text[6:7] in (" ", "(", "\t", "\n")


def _parse(text: str, mode: str) -> ast.AST | None:
    try:
        return ast.parse(text, mode=mode)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


def _syntax_reason(text: str) -> str:
    try:
        ast.parse(text, mode="eval")
    except SyntaxError as error:
        where = f" (line {error.lineno})" if error.lineno and "\n" in text else ""
        return f"not one Python expression: {error.msg}{where}"
    except (ValueError, RecursionError, MemoryError, OverflowError):
        return f"not one Python expression: nested too deeply (at most {MAX_DEPTH} levels)"
    return "not one Python expression"


def _program(module: ast.Module, inputs: tuple[str, ...]) -> _Part:
    """The expression a whole program's `equation` returns, its assignments inlined."""
    body = list(module.body)
    if body and _is_docstring(body[0]):
        body = body[1:]
    if body and isinstance(body[-1], ast.Return) and body[-1].value is not None:
        # `equation`'s body without its `def`: assignments and the final return
        reader = _Reader(inputs, {})
        for statement in body[:-1]:
            reader.assign(statement)
        return reader.expression(body[-1].value)
    named = named_result(body, (*inputs, "params", "equation", *MODULES))
    if named is not None:
        reader = _Reader(inputs, {})
        for statement in body:
            reader.assign(statement)
        return reader.bound[named]
    functions = []
    for statement in body:
        if isinstance(statement, ast.Import) and _is_numpy_import(statement):
            continue
        if isinstance(statement, ast.FunctionDef) and statement.name == "equation":
            functions.append(statement)
            continue
        if assigns(statement, "equation"):
            raise Refused("the program defines no function `equation`: it assigns that name")
        raise Refused(
            f"{_what(statement)} outside `equation`: a program is only `import numpy as np` and"
            " `def equation(...)` returning one expression (or write the expression alone)"
        )
    if len(functions) != 1:
        raise Refused(
            "the program defines no function `equation`"
            if not functions
            else "the program defines `equation` twice"
        )
    function = functions[0]
    _check_signature(function, inputs)
    statements = function.body
    if statements and _is_docstring(statements[0]):
        statements = statements[1:]
    if not statements or not isinstance(statements[-1], ast.Return) or statements[-1].value is None:
        raise Refused("`equation` must end with `return <expression>`")
    reader = _Reader(inputs, {})
    for statement in statements[:-1]:
        reader.assign(statement)
    returned = statements[-1].value
    assert returned is not None
    return reader.expression(returned)


def _check_signature(function: ast.FunctionDef, inputs: tuple[str, ...]) -> None:
    expected = (*inputs, "params")
    arguments = function.args
    names = tuple(a.arg for a in arguments.posonlyargs + arguments.args)
    wanted = f"`def equation({', '.join(expected)})`"
    if function.decorator_list:
        raise Refused(f"`equation` may not be decorated: write {wanted}")
    if (
        arguments.vararg
        or arguments.kwarg
        or arguments.kwonlyargs
        or arguments.defaults
        or arguments.kw_defaults
    ):
        raise Refused(f"`equation` takes no defaults, * or ** arguments: write {wanted}")
    if names != expected:
        raise Refused(f"`equation` must take exactly ({', '.join(expected)}): write {wanted}")


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _is_numpy_import(statement: ast.Import) -> bool:
    return all(alias.name == "numpy" and alias.asname in (None, "np") for alias in statement.names)


def _what(node: ast.AST) -> str:
    names = {
        ast.Import: "an import",
        ast.ImportFrom: "an import",
        ast.FunctionDef: "a function",
        ast.AsyncFunctionDef: "a function",
        ast.ClassDef: "a class",
        ast.Assign: "an assignment",
        ast.For: "a loop",
        ast.While: "a loop",
        ast.If: "an if statement",
        ast.With: "a with statement",
        ast.Try: "a try statement",
        ast.Expr: "an expression statement",
    }
    return names.get(type(node), f"a {type(node).__name__} statement")


class _Reader:
    """Checks an expression node by node against the grammar, inlining the names it binds."""

    def __init__(self, inputs: tuple[str, ...], bound: dict[str, _Part]) -> None:
        self.inputs = inputs
        self.bound = bound

    def assign(self, statement: ast.stmt) -> None:
        """`name = expression`, `name: annotation = expression` or `name op= expression`."""
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], self.expression(statement.value)
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, self.expression(statement.value)
        elif isinstance(statement, ast.AugAssign) and type(statement.op) in _OPERATORS:
            target = statement.target
            if not isinstance(target, ast.Name):
                raise Refused("assign to plain names only (`a = ...`), not to parts of values")
            left, right = self.name(target), self.expression(statement.value)
            value = self.combine(ast.BinOp(left.tree, statement.op, right.tree), left, right)
        else:
            raise Refused(
                f"{_what(statement)} in `equation`: its body is assignments (`a = ...`) and one"
                " final `return <expression>`, nothing else"
            )
        if not isinstance(target, ast.Name):
            raise Refused(
                "assign to plain names only (`a = ...`), not to tuples or parts of values"
            )
        if target.id in ("params", *MODULES):
            raise Refused(f"`{target.id}` may not be assigned: name the value something else")
        self.bound[target.id] = value

    def expression(self, node: ast.AST) -> _Part:
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _OPERATORS:
                symbol = type(node.op).__name__
                raise Refused(f"the operator {symbol} is not allowed: write {ALLOWED}")
            left = self.expression(node.left)
            if isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant):
                right = _Part(ast.Constant(_literal(node.right.value, exponent=True)), 1, 1)
            else:
                right = self.expression(node.right)
            return self.combine(ast.BinOp(left.tree, node.op, right.tree), left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            operand = self.expression(node.operand)
            if isinstance(node.op, ast.UAdd):
                return operand
            return self.combine(ast.UnaryOp(ast.USub(), operand.tree), operand)
        if isinstance(node, ast.Constant):
            return _Part(ast.Constant(_literal(node.value)), 1, 1)
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.Subscript):
            return _Part(
                ast.Subscript(
                    ast.Name("params", ast.Load()), ast.Constant(_index(node)), ast.Load()
                ),
                1,
                1,
            )
        if isinstance(node, ast.Attribute):
            if _is_np(node.value) and node.attr in CONSTANTS:
                return _Part(ast.Attribute(ast.Name("np", ast.Load()), node.attr, ast.Load()), 1, 1)
            raise Refused(f"`{_short(node)}` is not allowed: the only constants are np.pi and np.e")
        if isinstance(node, ast.Call):
            return self.call(node)
        raise Refused(f"{_describe(node)} is not allowed in an equation: write {ALLOWED}")

    def name(self, node: ast.Name) -> _Part:
        if node.id in self.bound:
            return self.bound[node.id]
        if node.id in self.inputs:
            return _Part(ast.Name(node.id, ast.Load()), 1, 1)
        if node.id == "params":
            raise Refused("use params only as params[k] with k a number from 0 to 9")
        if node.id == "np":
            raise Refused("use np only to call its functions, as np.sin(x)")
        raise Refused(
            f"the expression uses `{node.id}`: only the inputs ({', '.join(self.inputs)}),"
            " params and np are defined"
        )

    def call(self, node: ast.Call) -> _Part:
        function = node.func
        if isinstance(function, ast.Attribute) and _is_np(function.value):
            name = function.attr
        elif (
            isinstance(function, ast.Name)
            and function.id not in self.bound
            and (function.id == "abs" or function.id in FUNCTIONS)
        ):
            name = function.id  # `sin(x)`: only np's functions can be meant
        else:
            raise Refused(
                f"`{_short(function)}(...)` is not allowed: the functions are {FUNCTION_LIST}"
            )
        if name not in FUNCTIONS:
            raise Refused(f"np.{name} is not allowed: the functions are {FUNCTION_LIST}")
        if (
            node.keywords
            or len(node.args) != FUNCTIONS[name]
            or any(isinstance(a, ast.Starred) for a in node.args)
        ):
            count = FUNCTIONS[name]
            raise Refused(f"np.{name} takes {count} argument{'s' * (count > 1)}, no keywords")
        args = [self.expression(arg) for arg in node.args]
        name = "abs" if name == "absolute" else name
        tree = ast.Call(
            ast.Attribute(ast.Name("np", ast.Load()), name, ast.Load()), [a.tree for a in args], []
        )
        return self.combine(tree, *args)

    @staticmethod
    def combine(tree: ast.expr, *children: _Part) -> _Part:
        nodes = 1 + sum(child.nodes for child in children)
        depth = 1 + max(child.depth for child in children)
        if nodes > MAX_NODES:
            raise Refused(
                f"the equation is over {MAX_NODES} terms and operations once its assignments"
                " are inlined"
            )
        if depth > MAX_DEPTH:
            raise Refused(f"the equation is nested over {MAX_DEPTH} levels deep")
        return _Part(tree, nodes, depth)


def _literal(value: object, exponent: bool = False) -> float | int:
    """A number as the program writes it: a float, but for a whole-number exponent (`x ** 2`).
    No integer arithmetic reaches the program, so `9 ** 9 ** 9` is a float overflow there, not
    an endless big-integer power."""
    if type(value) is int or type(value) is float:
        if not (abs(value) <= MAX_LITERAL and math.isfinite(value)):
            raise Refused(
                f"numbers must lie within +-{MAX_LITERAL:g}: leave larger constants to params"
            )
        return value if exponent and type(value) is int else float(value)
    if type(value) is bool or value is None:
        raise Refused(f"`{value}` is not a number: an equation holds numbers only")
    raise Refused(
        f"{type(value).__name__} literals are not allowed: an equation holds numbers only"
    )


def _index(node: ast.Subscript) -> int:
    index = node.slice
    if not (isinstance(node.value, ast.Name) and node.value.id == "params"):
        raise Refused("only params may be indexed, as params[k] with k a number from 0 to 9")
    if isinstance(index, ast.Constant) and type(index.value) is int and 0 <= index.value < NPARAMS:
        return index.value
    raise Refused("index params with a number from 0 to 9 only, as params[3]")


# The modules a function or constant may be named from: `numpy.sin(x)` and `math.pi` can only
# mean np.sin and np.pi here, and the program is written with np whatever the text said.
MODULES = ("np", "numpy", "math")


def _is_np(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in MODULES


def _short(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except (ValueError, RecursionError):
        text = type(node).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _describe(node: ast.AST) -> str:
    kinds = {
        ast.Lambda: "a lambda",
        ast.ListComp: "a comprehension",
        ast.SetComp: "a comprehension",
        ast.DictComp: "a comprehension",
        ast.GeneratorExp: "a comprehension",
        ast.IfExp: "a conditional expression",
        ast.Compare: "a comparison",
        ast.BoolOp: "`and`/`or`",
        ast.NamedExpr: "`:=`",
        ast.List: "a list",
        ast.Tuple: "a tuple",
        ast.Dict: "a dict",
        ast.Set: "a set",
        ast.JoinedStr: "an f-string",
        ast.Await: "await",
        ast.Yield: "yield",
        ast.YieldFrom: "yield",
        ast.Starred: "`*`",
        ast.Slice: "a slice",
    }
    return kinds.get(type(node), f"`{_short(node)}`")
