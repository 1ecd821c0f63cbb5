"""The NKI meta-programming subset: what the real compiler accepts that plain Python also would.

The NKI language guide lists the values a kernel handles (None, bools, 32-bit integers, 32-bit
floats, strings, tensors), the containers (tuples, lists, dicts with string keys, classes derived
from ``NKIObject`` only, enumerations) and the control flow (``if``, ``for`` over ranges, lists
or tuples, ``while``). The Beta 2 front-end parses the kernel's source itself (AWS's KLR,
github.com/leanprover/KLR: ``interop/klr/gather.c`` converts the Python AST,
``KLR/NKI/Simplify.lean`` lowers it) and refuses the rest. The simulator runs kernels as Python,
so it checks, at launch, in two tiers:

- refused (``SubsetError``): ``try``, generators, ``async``/``await``, ``global``/``nonlocal``,
  sets, classes that derive from anything but ``NKIObject`` / ``Enum`` / ``NamedTuple``, a
  ``for`` target that is not a simple variable (``for a, b in ...``: "expecting simple
  variable", which users also report from deployed NKI) and ``else`` on a loop;
- flagged (``SubsetWarning``, once per kernel; an error under ``NKI_SIM_SUBSET=strict``): what
  that front-end's newest public source (March 2026) refuses or has no form for, but no report
  from deployed NKI confirms: ``raise``, ``del``, ``import`` or ``class`` inside a function,
  ``match``, lambdas, list / dict / generator comprehensions, ``:=``, ``*`` / ``**`` expansion,
  ``*args`` parameters, ``@``, dict displays with keys other than string constants. That source
  also refuses inner functions, which the current documentation uses (a ``fori_loop`` body),
  so it has grown since; AWS's own kernel library (nki-library, ~1,200 loops) uses none of the
  flagged constructs in kernel code.

Every argument is checked too: a tensor, number (integers within 32 bits), string, None, dtype,
ALU operator, function, ``NKIObject`` or ``Enum`` member, or a tuple / dict (string keys) of
those.

Each refusal names the construct and the kernel line, or the argument.
The check covers the ``nki.jit`` function's body and, as the real compiler inlines them, the
helper functions it calls, transitively: every call whose callee resolves statically (a name in
the function's globals or closure, or ``module.name`` / ``Class.name`` of one) to a Python
function outside the simulator, NumPy and the standard library. Calls through values known only
at run time (a function passed as an argument, a method of an instance) are not followed.
"""

from __future__ import annotations

import ast
import enum
import inspect
import os
import sys
import sysconfig
import textwrap
import warnings

import numpy as np

from .errors import SubsetError, SubsetWarning  # noqa: F401 (SubsetWarning: re-exported)
from .objects import NKIObject

INT32 = (-2**31, 2**32 - 1)            # signed or unsigned 32-bit
_checked = {}                          # (id(code), strict) -> (code, None | SubsetError)


_REFUSED = {
    ast.Try: "try/except", ast.Yield: "yield (generators)", ast.YieldFrom: "yield from",
    ast.Await: "await", ast.AsyncFor: "async for", ast.AsyncWith: "async with",
    ast.AsyncFunctionDef: "async def", ast.Global: "global", ast.Nonlocal: "nonlocal",
    ast.Set: "set displays", ast.SetComp: "set comprehensions",
}
if hasattr(ast, "TryStar"):
    _REFUSED[ast.TryStar] = "try/except*"
_FLAGGED = {
    ast.Raise: "raise (use assert)", ast.Delete: "del", ast.Import: "import inside a function",
    ast.ImportFrom: "import inside a function", ast.Lambda: "lambda",
    ast.ListComp: "list comprehensions", ast.DictComp: "dict comprehensions",
    ast.GeneratorExp: "generator expressions", ast.NamedExpr: "assignment expressions (:=)",
    ast.Starred: "*-expansion", ast.ClassDef: "a class defined inside a function",
}
if hasattr(ast, "Match"):
    _FLAGGED[ast.Match] = "match"
_CLASS_BASES = {"NKIObject", "Enum", "IntEnum", "NamedTuple"}


def _base_name(node) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "?")


def _strict() -> bool:
    return os.environ.get("NKI_SIM_SUBSET", "").lower() == "strict"


def _refusal(node):
    """What deployed NKI refuses in ``node`` (None if nothing)."""
    for kind, what in _REFUSED.items():
        if isinstance(node, kind):
            return f"{what} is not part of the NKI language"
    if isinstance(node, (ast.For, ast.comprehension)) and not isinstance(node.target, ast.Name):
        return ("a for target must be a simple variable (the front-end says \"expecting simple "
                "variable\"): iterate over an index and unpack in the body")
    if isinstance(node, (ast.For, ast.While)) and node.orelse:
        return "else on a loop is not part of the NKI language"
    if isinstance(node, ast.ClassDef):
        bad = [_base_name(b) for b in node.bases if _base_name(b) not in _CLASS_BASES]
        if bad or not node.bases:
            return (f"class {node.name} must derive from NKIObject (or Enum, NamedTuple) and no "
                    f"other class")
    return None


def _flag(node):
    """What the front-end's public source has no form for in ``node`` (None if nothing)."""
    for kind, what in _FLAGGED.items():
        if isinstance(node, kind):
            return what
    if isinstance(node, ast.FunctionDef) and node.args.vararg is not None:
        return "*args parameters"
    if isinstance(node, ast.keyword) and node.arg is None:
        return "**-expansion of keyword arguments"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return "the @ operator"
    if isinstance(node, ast.Dict) and not all(
            isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
        return "dict displays with keys other than string constants"
    return None


def _violation(tree, flagged):
    """The first refused construct of ``tree`` (a function's source) as (node, message), or
    None; the flagged ones are appended to ``flagged`` as (node, message) as they are met."""
    for node in ast.walk(tree):
        message = _refusal(node)
        if message is not None:         # (a comprehension clause has no line: its target does)
            return (node.target if isinstance(node, ast.comprehension) else node), message
        what = _flag(node)
        if what is not None:
            flagged.append((node, f"{what}: the NKI front-end's public source has no form for "
                                  f"this"))
    return None


def check_function(fn) -> None:
    """Raise ``SubsetError`` when ``fn``'s source, or a helper it calls, uses Python the NKI
    compiler refuses; warn (``SubsetWarning``, once) of the flagged constructs, or raise for
    them too under ``NKI_SIM_SUBSET=strict``."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    # keyed by the code object's identity (equal code objects of two functions, e.g. one source
    # exec'd twice, compare equal but may call different helpers); the entry keeps it alive
    key = (id(code), _strict())
    if key not in _checked:
        flagged = []
        error = _scan(fn, code, fn.__name__, set(), flagged)
        if error is None and flagged:
            where, message = flagged[0]
            more = f" (and {len(flagged) - 1} more)" if len(flagged) > 1 else ""
            if key[1]:
                error = SubsetError(f"{message}{more} [NKI_SIM_SUBSET=strict]", op="nki.jit",
                                    location=where)
            else:                    # pointed at the first frame outside the simulator
                level, frame = 1, sys._getframe()
                while frame is not None and frame.f_code.co_filename.startswith(_SIMULATOR):
                    level, frame = level + 1, frame.f_back
                warnings.warn(SubsetWarning(f"{where}: {message}{more}; they may not compile on "
                                            f"Trainium (NKI_SIM_SUBSET=strict refuses them)"),
                              stacklevel=level)
        _checked[key] = (code, error)
    error = _checked[key][1]
    if error is not None:
        raise error


def _scan(fn, code, kernel, seen, flagged):
    """The first refusal in ``fn`` or the helpers it calls (None when clean); ``kernel``
    names the launched function in the message, ``seen`` the ids of code objects visited; flagged
    constructs are appended to ``flagged`` as (location, message)."""
    seen.add(id(code))
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None                                  # no source (exec'd): nothing to check
    try:
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except SyntaxError:
        return None
    via = "" if fn.__name__ == kernel else f" (in helper {fn.__name__}, which it calls)"
    where = lambda node: f"{code.co_filename.rsplit('/', 1)[-1]}:{first + node.lineno - 1}"  # noqa: E731
    found_here = []
    found = _violation(tree, found_here)
    flagged.extend((where(node), f"kernel {kernel}{via}: {message}") for node, message in found_here)
    if found is not None:
        node, message = found
        return SubsetError(f"kernel {kernel}{via}: {message}", op="nki.jit", location=where(node))
    for helper, node in _callees(fn, tree):
        if node is not None:                         # a class the kernel builds: NKI compiles it
            if not _nki_class(helper):
                return SubsetError(
                    f"kernel {kernel}{via}: it builds a {helper.__name__}, a class that does not "
                    f"derive from NKIObject (or Enum, NamedTuple); NKI compiles only those",
                    op="nki.jit", location=where(node))
            continue                                 # (its methods follow it in the list)
        if id(helper.__code__) in seen:
            continue
        error = _scan(helper, helper.__code__, kernel, seen, flagged)
        if error is not None:
            return error
    return None


def _callees(fn, tree):
    """The Python functions and classes ``fn`` calls by a name its globals or closure bind (or an
    attribute of one), outside the simulator, NumPy and the standard library, in call order:
    (function, None), or (class, its call node) followed by (method, None) per method."""
    scope = dict(fn.__globals__)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                scope[name] = cell.cell_contents
            except ValueError:                       # an empty cell (assigned later)
                pass
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target, chain = node.func, []
        while isinstance(target, ast.Attribute):
            chain.append(target.attr)
            target = target.value
        if not isinstance(target, ast.Name) or target.id not in scope:
            continue
        value = scope[target.id]
        for attr in reversed(chain):
            if not (inspect.ismodule(value) or inspect.isclass(value)):
                value = None
                break
            value = inspect.getattr_static(value, attr, None)
        if inspect.isclass(value):
            if _user_class(value):
                out.append((value, node))
                out += [(m, None) for m in map(_user_function, vars(value).values()) if m]
        else:
            function = _user_function(value)
            if function is not None:
                out.append((function, None))
    return out


def _user_function(value):
    """``value`` as a plain function of user code (a static or class method unwrapped), or
    None."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    return value if inspect.isfunction(value) and _user_code(value.__code__.co_filename) else None


def _user_class(cls) -> bool:
    module = sys.modules.get(cls.__module__)
    filename = getattr(module, "__file__", None)
    return filename is not None and _user_code(filename)


def _nki_class(cls) -> bool:
    """Derived from NKIObject or Enum, or a NamedTuple: a class NKI kernels may build."""
    if any(c.__name__ in _CLASS_BASES for c in cls.__mro__[1:]):
        return True
    return tuple in cls.__bases__ and hasattr(cls, "_fields")      # typing.NamedTuple


def _user_code(filename: str) -> bool:
    """Kernel-side Python: this project's kernels, or code outside the simulator, installed
    packages and the standard library."""
    path = os.path.realpath(filename)
    if path.startswith(_SIMULATOR):
        return False
    if path.startswith(_KERNELS):
        return True
    return not path.startswith(_INSTALLED)


_SIMULATOR = os.path.dirname(os.path.realpath(__file__)) + os.sep
_PARENT = os.path.dirname(_SIMULATOR.rstrip(os.sep))    # installed: nki_kernels/simulate
_KERNELS = (_PARENT if os.path.basename(_PARENT) == "nki_kernels"
            else os.path.join(_PARENT, "nki_kernels")) + os.sep
_INSTALLED = tuple(os.path.realpath(sysconfig.get_paths()[k]) + os.sep
                   for k in ("stdlib", "purelib", "platlib"))


def check_argument(value, where: str) -> None:
    """Raise ``SubsetError`` unless ``value`` is a kind of value NKI kernels take."""
    from .ops import Op
    if value is None or isinstance(value, (bool, str, float, np.floating, np.bool_, np.dtype,
                                           Op, NKIObject, enum.Enum)):
        return
    if isinstance(value, (int, np.integer)):
        if not INT32[0] <= int(value) <= INT32[1]:
            raise SubsetError(f"{where}={int(value)} does not fit in 32 bits (NKI integers are "
                              f"32-bit); pass it as device data", op="nki.jit", operand=where)
        return
    if isinstance(value, tuple):
        for i, v in enumerate(value):
            check_argument(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise SubsetError(f"{where}: dict key {k!r} is not a string (NKI dicts take "
                                  f"string keys only)", op="nki.jit", operand=where)
            check_argument(v, f"{where}[{k!r}]")
        return
    if _is_tensor(value) or callable(value):          # functions (inlined), classes, kernels
        return
    raise SubsetError(f"{where}: a {type(value).__name__} is not a value NKI kernels take "
                      f"(tensors, numbers, strings, None, dtypes, tuples, dicts with string "
                      f"keys, NKIObject or Enum instances, functions)", op="nki.jit",
                      operand=where)


def _is_tensor(value) -> bool:
    from .tensor import ndarray
    return (isinstance(value, (np.ndarray, ndarray))
            or (type(value).__module__.startswith(("torch", "jax")) and hasattr(value, "shape")))
