"""The trusted driver that fits a candidate's equation inside the sandbox (never imported there:
its text is appended to the candidate's program, and the sandbox calls `_vpo_equation_discovery`).

It fits `params` as LLM-SR does (scipy BFGS from ten ones on the training MSE, numerical
gradients, scipy's default tolerances, at most `maxiter` iterations) and returns the fitted
equation's predictions on the two test sets' inputs, plus how many entries of `params` the
fitted equation depends on. The test targets are never here; the parent scores the predictions.

It runs in the candidate's process, after the candidate's module-level code, so it cannot be
fully trusted. What it does against a hostile program, cheaply:
- every name it defines starts with `_vpo_ed`, and it reads only `equation` from the program;
- it binds the modules and functions it uses when it is defined, so a patch made later, inside
  `equation` during the fit, does not reach it; its loss uses ndarray operators (an immutable
  type), not numpy's module functions;
- before and after fitting it refuses a program that replaced a function of numpy, scipy, math,
  sys, builtins or functools with code of its own (a tripwire for `np.mean = ...`: a scan of
  those modules, about 15 ms), that redefines a builtin name at module level (the driver's
  own `len` would be the program's), or that left a trace or profile function installed;
- during the fit an audit hook refuses opening files other than code (.py, .pyc, .so), frame
  and garbage-collector introspection, tracing, ctypes, new processes and importing the
  harness's own packages: the routes to the training targets in its frames or to the data on
  disk;
- `equation` gets fresh copies of its inputs and of `params` on every call, and the training
  target shares no buffer with them.
What is left (see docs/problems.md): module-level code runs before all of this with the whole
interpreter in reach. The test targets are out of its reach: the parent never sends them here,
and the sandbox hides the package's data/ and the project's packages from the program (data/
is an empty folder to it). The training targets are not, by design: they are in this process, and
a program can reach them by ways the tripwire does not recognise and interpolate them, which
scores in-domain and fails out of domain (fit_ood).
"""

import builtins as _vpo_ed_builtins
import functools as _vpo_ed_functools
import math as _vpo_ed_math
import sys as _vpo_ed_sys
import types as _vpo_ed_types
import warnings as _vpo_ed_warnings

import numpy as _vpo_ed_np
import scipy.optimize as _vpo_ed_optimize

_vpo_ed_minimize = _vpo_ed_optimize.minimize
_vpo_ed_asarray = _vpo_ed_np.asarray
_vpo_ed_errstate = _vpo_ed_np.errstate
_vpo_ed_addaudithook = _vpo_ed_sys.addaudithook
_vpo_ed_modules = _vpo_ed_sys.modules
# the program and this driver are one compiled unit: its functions carry this file name
_vpo_ed_program_file = (lambda: None).__code__.co_filename
_vpo_ed_program_module = __name__
_vpo_ed_program = _vpo_ed_builtins.globals()  # the module's namespace: the program's and ours
_vpo_ed_builtin_names = frozenset(vars(_vpo_ed_builtins))

_vpo_ed_NPARAMS = 10
_vpo_ed_WATCHED = ("numpy", "scipy", "math", "sys", "builtins", "functools")
_vpo_ed_CODE_FILES = (".py", ".pyc", ".so")
_vpo_ed_HARNESS_PACKAGES = ("problems", "harness", "trainer")
_vpo_ed_REFUSED = {
    "sys._getframe": "inspect the driver's frames",
    "sys._current_frames": "inspect the driver's frames",
    "sys._current_exceptions": "inspect the driver's frames",
    "object.__getattr__": "inspect frames or code objects",
    "object.__setattr__": "change classes or code objects",
    "object.__delattr__": "change classes or code objects",
    "gc.get_objects": "search the process's objects",
    "gc.get_referrers": "search the process's objects",
    "gc.get_referents": "search the process's objects",
    "sys.settrace": "trace the driver",
    "sys.setprofile": "trace the driver",
    "sys.addaudithook": "add an audit hook",
    "os.system": "start a process",
    "os.exec": "start a process",
    "os.posix_spawn": "start a process",
    "os.spawn": "start a process",
    "os.fork": "start a process",
    "os.forkpty": "start a process",
    "subprocess.Popen": "start a process",
    "pty.spawn": "start a process",
    "mmap.__new__": "map memory or files",
}


def _vpo_ed_from_program(value):
    """Whether `value` is a function, method, partial, class or instance the program defined."""
    kind = type(value)
    if kind is _vpo_ed_types.MethodType:
        value, kind = value.__func__, type(value.__func__)
    if kind is _vpo_ed_functools.partial:
        value, kind = value.func, type(value.func)
    if kind is _vpo_ed_types.FunctionType:
        return value.__code__.co_filename == _vpo_ed_program_file
    if isinstance(value, type):
        return getattr(value, "__module__", None) == _vpo_ed_program_module
    return getattr(kind, "__module__", None) == _vpo_ed_program_module


def _vpo_ed_replaced():
    """The first 'module.name' among the watched libraries that the program replaced, or None."""
    for module_name, module in list(_vpo_ed_modules.items()):
        if module_name.partition(".")[0] not in _vpo_ed_WATCHED or module is None:
            continue
        for name, value in list(getattr(module, "__dict__", {}).items()):
            if _vpo_ed_from_program(value):
                return f"{module_name}.{name}"
    return None


def _vpo_ed_guard(on):
    """An audit hook that refuses, while on[0] is true, what a fit never needs (see the module)."""
    refused, code_files, harness = _vpo_ed_REFUSED, _vpo_ed_CODE_FILES, _vpo_ed_HARNESS_PACKAGES
    error = _vpo_ed_builtins.PermissionError

    def hook(event, args):
        if not on[0]:
            return
        if event == "open":
            path = args[0]
            if isinstance(path, bytes):
                path = path.decode("utf-8", "replace")
            mode = args[1] if isinstance(args[1], str) else "r"
            if isinstance(path, str) and path.endswith(code_files) and set(mode) <= set("rb"):
                return  # an import reading code
            raise error(f"the equation may not open files during the fit ({path!r})")
        if event == "import" and str(args[0]).partition(".")[0] in harness:
            raise error(f"the equation may not import the harness's package {args[0]!r}")
        if event in refused or event.startswith(("ctypes.", "socket.", "os.exec", "os.spawn")):
            what = refused.get(event, "use " + event)
            raise error(f"the equation may not {what} during the fit")

    return hook


def _vpo_ed_predict(equation, columns, params, rows):
    """equation(*columns, params) as float64 of shape (rows,), or an error saying what it gave."""
    value = equation(*[column.copy() for column in columns], params.copy())
    found = _vpo_ed_asarray(value)
    if found.dtype.kind not in "fiub":
        raise TypeError(f"equation returned {found.dtype} values, not real numbers")
    if found.shape != (rows,):
        raise ValueError(
            f"equation returned shape {found.shape} for {rows} rows; return one value per row"
        )
    return found.astype("float64")


def _vpo_ed_columns(inputs):
    """Contiguous copies of each input column: a candidate reading `.base` finds nothing else."""
    return [inputs[:, j].copy() for j in range(inputs.shape[1])]


def _vpo_equation_discovery(train_inputs, train_target, id_inputs, ood_inputs, maxiter):
    equation = _vpo_ed_program.get("equation")
    if not callable(equation):
        raise NameError("the program defines no function `equation`")
    # The statement says numpy is available as np: so it is, where the program did not import it.
    _vpo_ed_program.setdefault("np", _vpo_ed_np)
    # the driver's own lookups of builtins go through the program's globals first
    shadowed = sorted(n for n in _vpo_ed_program if n in _vpo_ed_builtin_names and n[:2] != "__")
    if shadowed:
        raise NameError(f"the program redefines the builtin {shadowed[0]!r}; rename it")
    # a trace or profile function sees every frame of the fit, the training target's included
    if _vpo_ed_sys.gettrace() is not None or _vpo_ed_sys.getprofile() is not None:
        raise PermissionError("the program installed a trace or profile function")
    replaced = _vpo_ed_replaced()
    if replaced is not None:
        raise PermissionError(f"the program replaced {replaced}; equations may not patch libraries")
    # scipy imports parts of itself lazily: one tiny fit before the guard goes up
    _vpo_ed_minimize(lambda p: float(p @ p), [1.0, 1.0], method="BFGS", options={"maxiter": 2})
    train = _vpo_ed_columns(train_inputs)
    target = train_target.copy()
    rows = target.shape[0]
    on = [True]
    _vpo_ed_addaudithook(_vpo_ed_guard(on))
    try:
        with _vpo_ed_errstate(all="ignore"), _vpo_ed_warnings.catch_warnings():
            _vpo_ed_warnings.simplefilter("ignore")

            def loss(params):
                residual = _vpo_ed_predict(equation, train, params, rows) - target
                return float(residual @ residual) / rows

            fit = _vpo_ed_minimize(
                loss, [1.0] * _vpo_ed_NPARAMS, method="BFGS", options={"maxiter": maxiter}
            )
            params = _vpo_ed_asarray(fit.x, dtype="float64").copy()
            fitted = _vpo_ed_predict(equation, train, params, rows)
            residual = fitted - target
            mse = float(residual @ residual) / rows
            if not _vpo_ed_math.isfinite(mse):
                raise ValueError("the fitted equation's training error is not finite (NaN or inf)")
            used = 0
            for i in range(_vpo_ed_NPARAMS):
                moved = params.copy()
                moved[i] += 1e-3 * max(1.0, abs(moved[i]))
                used += bool((_vpo_ed_predict(equation, train, moved, rows) != fitted).any())
            test_id = _vpo_ed_predict(equation, _vpo_ed_columns(id_inputs), params, len(id_inputs))
            test_ood = _vpo_ed_predict(
                equation, _vpo_ed_columns(ood_inputs), params, len(ood_inputs)
            )
    finally:
        on[0] = False
    replaced = _vpo_ed_replaced()
    if replaced is not None:
        raise PermissionError(
            f"the equation replaced {replaced}; equations may not patch libraries"
        )
    shown = ", ".join(f"{p:.6g}" for p in params)
    print(f"fitted params: [{shown}]; {fit.nit} BFGS iterations; training MSE {mse:.6g}")
    return {"test_id": test_id, "test_ood": test_ood, "params_used": used}
