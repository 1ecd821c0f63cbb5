"""Run vllm-neuron's NKI collective kernels unchanged in the simulator (4 ranks) against the
semantics their wrappers document.

Usage::

    python3 tools/vllm_neuron_kernels.py --vllm-neuron PATH [--target trn2|trn3]

``PATH`` is a local checkout of a vllm-neuron tree that has
``vllm_neuron/functional/collectives/{all_gather_v,all_to_all_v}.py`` (checked with
github.com/jinhuang12/vllm-neuron at ed3580d0; nothing of it is copied into this repository).
Each kernel file is loaded by path with its serving-stack imports (``vllm``, ``vllm_neuron.envs``,
``libtorch_neuronx_lite``) replaced by inert stand-ins, since only the ``@nki.jit`` kernel is
run: ``_all_gather_v_nki`` / ``_all_to_all_v_nki`` with per-rank inputs, as a job of 4 ranks of
one NeuronCore each (the stack launches them at LNC=2; the kernels use no ``program_id``, and
multi-rank LNC=2 jobs are not simulated). The expected results are computed here in NumPy from
the wrappers' documented semantics. Prints ran / matched per case and ``N passed, M failed``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import types

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RANKS = 4
KERNELS = "vllm_neuron/functional/collectives"


def _stub_serving_stack():
    """Inert modules for the imports the kernel files make outside NKI."""
    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        m.__path__ = []
        sys.modules.setdefault(name, m)
        return sys.modules[name]

    class GroupCoordinator:                       # only the wrappers (not run) use it
        pass

    mod("vllm")
    mod("vllm.distributed")
    mod("vllm.distributed.parallel_state", GroupCoordinator=GroupCoordinator)
    mod("vllm_neuron")
    mod("vllm_neuron.envs", VLLM_NEURON_CPU_MODE=False, VLLM_NEURON_SWITCH_CC=False)
    mod("vllm_neuron.parallel")
    mod("vllm_neuron.parallel.neuron_parallel_state", is_internode_group=lambda g: False,
        get_node_group=lambda: None)
    mod("libtorch_neuronx_lite")
    mod("libtorch_neuronx_lite.nki")
    mod("libtorch_neuronx_lite.nki.nki_hop", wrap_nki=lambda f: f)


def _load(root, name):
    path = os.path.join(root, KERNELS, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_vllm_neuron_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _meta(rows):
    return np.array(rows, np.uint32)


def _all_gather_v_case(module, target, rng, dtype, shape, intermediate, known):
    """Rank r broadcasts input_r.flat[displ:displ + count_r] (count_r differs per rank); the
    output is cut in 4 slots, slot s = rank s's chunk, the rest untouched."""
    size = int(np.prod(shape))
    counts = [size - r for r in range(RANKS)]
    displ = 1 if size > RANKS else 0
    counts = [min(c, size - displ) for c in counts]
    inputs = [rng.standard_normal(shape).astype(dtype) for _ in range(RANKS)]
    out0 = rng.standard_normal((RANKS * shape[0],) + tuple(shape[1:])).astype(dtype)
    metas = [_meta([[counts[r]] * RANKS, [displ] * RANKS, [99] * RANKS]) for r in range(RANKS)]
    return _run(module._all_gather_v_nki, target, inputs, out0, metas,
                dict(group=tuple(range(RANKS)), recv_counts_known=known,
                     cc_use_intermediate_io=intermediate),
                lambda r: _slots(out0, [inputs[s].reshape(-1)[displ:displ + counts[s]]
                                        for s in range(RANKS)], None),
                lambda r: counts)


def _all_to_all_v_case(module, target, rng, rdispls):
    """Rank s sends input_s.flat[displs[d]:][:count(s, d)] to rank d; rank d writes it in slot
    s of its output (or at recv_displs[s]); the rest untouched (zeroed first on trn3)."""
    per = 6
    inputs = [rng.integers(0, 1000, (RANKS * per,)).astype(np.int32) for _ in range(RANKS)]
    out0 = np.full(RANKS * per, -7, np.int32)

    def count(s, d):
        return (s + 2 * d) % per + 1

    def recv_displs(d):
        return list(np.cumsum([0] + [count(s, d) for s in range(RANKS)])[:-1])

    metas = []
    for r in range(RANKS):
        rows = [[count(r, d) for d in range(RANKS)], [per * d for d in range(RANKS)],
                [0] * RANKS]
        metas.append(_meta(rows + ([recv_displs(r)] if rdispls else [[0] * RANKS])))
    base = np.zeros_like(out0) if target == "trn3" else out0

    def want(d):
        chunks = [inputs[s][per * d:per * d + count(s, d)] for s in range(RANKS)]
        return _slots(base, chunks, recv_displs(d) if rdispls else None)
    return _run(module._all_to_all_v_nki, target, inputs, out0, metas,
                dict(group=tuple(range(RANKS)), has_rdispls=rdispls), want,
                lambda d: [count(s, d) for s in range(RANKS)])


def _slots(out0, chunks, displs):
    flat = out0.reshape(-1).copy()
    slot = flat.size // len(chunks)
    for s, c in enumerate(chunks):
        start = slot * s if displs is None else displs[s]
        flat[start:start + c.size] = c
    return flat.reshape(out0.shape)


def _run(kernel, target, inputs, out0, metas, static, want_out, want_counts):
    from nki_kernels import simulate
    got = simulate.simulate(kernel, target=target, ranks=RANKS)(
        input=simulate.per_rank([x.copy() for x in inputs]),
        output=simulate.per_rank([out0.copy() for _ in range(RANKS)]),
        metadata=simulate.per_rank([m.copy() for m in metas]), **static)
    for r, (out, meta) in enumerate(got):
        np.testing.assert_array_equal(np.asarray(out), want_out(r), err_msg=f"rank {r} output")
        if not static.get("recv_counts_known", False):
            np.testing.assert_array_equal(np.asarray(meta)[2], want_counts(r),
                                          err_msg=f"rank {r} recv counts")
        else:
            np.testing.assert_array_equal(np.asarray(meta), metas[r], err_msg=f"rank {r} metadata")


CASES = {
    "all_gather_v fp32 1-D": lambda m, t, g: _all_gather_v_case(m["all_gather_v"], t, g,
                                                                np.float32, (10,), False, False),
    "all_gather_v bf16 2-D, intermediate I/O, counts known": lambda m, t, g: _all_gather_v_case(
        m["all_gather_v"], t, g, ml_dtypes.bfloat16, (4, 8), True, True),
    "all_to_all_v int32 slots": lambda m, t, g: _all_to_all_v_case(m["all_to_all_v"], t, g, False),
    "all_to_all_v int32 recv_displs": lambda m, t, g: _all_to_all_v_case(m["all_to_all_v"], t, g,
                                                                         True),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-neuron", required=True, help="checkout of a vllm-neuron tree")
    parser.add_argument("--target", nargs="*", default=["trn2", "trn3"])
    args = parser.parse_args(argv)
    root = os.path.abspath(args.vllm_neuron)
    commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown (not a git checkout)"
    from nki_kernels import simulate
    simulate.install()
    _stub_serving_stack()
    modules = {name: _load(root, name) for name in ("all_gather_v", "all_to_all_v")}
    print(f"vllm-neuron at {root} (commit {commit})")
    passed = failed = 0
    for target in args.target:
        for name, case in CASES.items():
            try:
                case(modules, target, np.random.default_rng(0))
                passed += 1
                print(f"  ran, matched   {target} {name}")
            except Exception as err:                 # report and go on
                failed += 1
                first = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
                print(f"  FAILED         {target} {name}: {type(err).__name__}: {first}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
