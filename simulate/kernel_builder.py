"""``nki.compiler.kernel_builder.compile_kernel``: compile (here: run in the simulator) a kernel
function with named input and output arrays and hyperparameters, as the NKI language guide's
kernel-builder example calls it::

    compile_kernel(tiled_process, inputs={"input_tensor": x}, outputs={"output_tensor": y},
                   compile_opts=opts, tile_fn=my_activation)

The function's parameters are bound by name: the inputs, the outputs (written in place, as a
kernel writes its output arguments) and the hyperparameters (compile-time values, functions
included, specialised as ``nki.jit`` specialises non-tensor arguments). ``compile_opts`` is
accepted and ignored (no compiler here). Returns the kernel's own return value.
"""

from __future__ import annotations

import inspect


def compile_kernel(kernel, inputs=None, outputs=None, compile_opts=None, **hyperparameters):
    from .launch import jit, simulate
    inputs, outputs = dict(inputs or {}), dict(outputs or {})
    clash = set(inputs) & set(outputs) | (set(inputs) | set(outputs)) & set(hyperparameters)
    if clash:
        raise ValueError(f"compile_kernel: {sorted(clash)} named twice among inputs, outputs and "
                         f"hyperparameters")
    fn = getattr(kernel, "fn", kernel)
    if not callable(fn):
        raise TypeError(f"compile_kernel: kernel must be a function, got {type(kernel).__name__}")
    known = inspect.signature(fn).parameters
    extra = [name for name in {**inputs, **outputs, **hyperparameters} if name not in known]
    if extra and not any(p.kind == p.VAR_KEYWORD for p in known.values()):
        raise TypeError(f"compile_kernel: {fn.__name__}() has no parameter(s) {extra}")
    launch = simulate(kernel if hasattr(kernel, "fn") else jit(kernel))
    return launch(**inputs, **outputs, **hyperparameters)
