"""Engine random numbers: ``rng``, ``rand2``, ``dropout``, ``set_rng_seed``, ``rand_set_state``,
``rand_get_state``.

Each engine (VectorE, GpSimd) keeps one XORWOW generator per partition lane, per program
instance, for the whole launch (on hardware the state persists for the rest of the NEFF run).
XORWOW (Marsaglia 2003) state per lane: five 32-bit words x, y, z, w, v and a Weyl counter d,
the 6 words ``rand_get_state`` returns for GpSimd. VectorE's documented state is 24 words; here
its lane holds four XORWOW generators used round-robin by element (assumed: the word order inside
the 24 is not documented). Unseeded lanes start from a fixed seed mixed with the lane number, so
a run is reproducible; ``set_rng_seed`` reseeds every VectorE lane from one 32-bit value.

Numbers are not bit-identical to hardware (the seeding is not documented); distributions and
the documented contracts are: ``rng`` writes the low bits of 32 random bits, ``rand2`` uniform
fp32 in [min, max], ``dropout`` zeroes each element with probability ``prob``.
"""

from __future__ import annotations

import numpy as np

from .. import context, dtypes
from ..errors import TargetError
from ..tensor import ndarray
from .activation import per_partition
from .core import as_2d, engine_name, fail, free_elems, on_chip, record
from .elementwise import store
from .enums import engine as engine_enum

WORDS = {"gpsimd": 6, "vector": 24}
DEFAULT_SEED = 0x2545F491
_MASK = np.uint64(0xFFFFFFFF)
INT_OUT = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.uint8, dtypes.uint16, dtypes.uint32)


def _mix(seed: int, lane: int, k: int) -> np.ndarray:
    """Six non-zero state words from (seed, lane, generator k) by splitmix64."""
    z = np.uint64((seed * 0x9E3779B1 + lane * 0x85EBCA6B + k * 0xC2B2AE35) & 0xFFFFFFFFFFFFFFFF)
    out = []
    with np.errstate(over="ignore"):
        for _ in range(6):
            z = z + np.uint64(0x9E3779B97F4A7C15)
            x = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            out.append(int((x ^ (x >> np.uint64(31))) & _MASK) or 1)
    return np.array(out, np.uint64)


def _states(engine: str) -> np.ndarray:
    """[pmax, WORDS] uint64 (32-bit values) state of ``engine`` for the running instance."""
    launch = context.current()
    bank = launch.__dict__.setdefault("rng_states", {})
    key = (engine, tuple(launch.program_id))
    if key not in bank:
        bank[key] = _seeded(DEFAULT_SEED, engine, launch.target.pmax)
    return bank[key]


def _seeded(seed: int, engine: str, lanes: int) -> np.ndarray:
    per = WORDS[engine] // 6
    return np.stack([np.concatenate([_mix(seed, lane, k) for k in range(per)])
                     for lane in range(lanes)])


def _draw(engine: str, parts: int, n: int) -> np.ndarray:
    """[parts, n] uint32 random words; lane p's generators advance in place."""
    st = _states(engine)
    per = WORDS[engine] // 6
    out = np.empty((parts, n), np.uint64)
    gens = [st[:parts, 6 * k:6 * k + 6] for k in range(per)]
    with np.errstate(over="ignore"):
        for j in range(n):
            g = gens[j % per]
            x, v = g[:, 0].copy(), g[:, 4].copy()
            t = (x ^ (x >> np.uint64(2))) & _MASK
            g[:, 0:4] = g[:, 1:5]
            v_new = ((v ^ ((v << np.uint64(4)) & _MASK)) ^ (t ^ ((t << np.uint64(1)) & _MASK))) & _MASK
            g[:, 4] = v_new
            g[:, 5] = (g[:, 5] + np.uint64(362437)) & _MASK
            out[:, j] = (v_new + g[:, 5]) & _MASK
    for k in range(per):
        st[:parts, 6 * k:6 * k + 6] = gens[k]
    return out.astype(np.uint32)


def _uniform(engine, parts, n) -> np.ndarray:
    """fp32 in [0, 1) from the top 24 bits of each word."""
    return (_draw(engine, parts, n) >> np.uint32(8)).astype(np.float32) / np.float32(2 ** 24)


def _rng_engine(engine, op):
    target = context.current().target
    eng = engine_name(engine, "vector", ("vector", "gpsimd"), op)
    if eng == "gpsimd" and target.nc_version < 3:
        context.fail(TargetError, f"{op} on GpSimd needs NeuronCore-v3+ (target {target.name}); "
                     f"use engine.vector", op=op, operand="engine")
    return eng


def rng(dst, engine=engine_enum.vector, name=None):
    """32 random bits per element, the low bits kept in ``dst``'s integer type."""
    o = "rng"
    eng = _rng_engine(engine, o)
    d = on_chip(dst, o, "dst", ("sbuf",) if eng == "gpsimd" else ("sbuf", "psum"))
    if dst.dtype not in INT_OUT:
        fail(f"dst dtype {dst.dtype.name} must be one of "
             f"{', '.join(t.name for t in INT_OUT)}", o, "dst")
    parts, n = dst.shape[0], free_elems(d)
    bits = _draw(eng, parts, n)
    d.write(bits.astype(dst.dtype).reshape(d.shape))      # integer casts keep the low bits
    return record(o, eng, {"dst": d}, name=name, partitions=parts, free_elems=n)


def _bound(value, role, parts, o, operands):
    """A number or a [P, 1] tile as fp32 [P, 1] (``activation.per_partition``), the tile kept
    among the recorded operands."""
    vals, r = per_partition(o, value, role, parts)
    if r is not None:
        operands[role] = r
    return vals


def rand2(dst, min, max, name=None):  # noqa: A002 - documented argument names
    """NeuronCore-v4 VectorE: uniform fp32 in [min, max] (numbers or [P, 1] tiles), cast to dst."""
    o = "rand2"
    target = context.current().target
    if target.nc_version < 4:
        context.fail(TargetError, f"{o} needs NeuronCore-v4+ (target {target.name})", op=o)
    d = on_chip(dst, o, "dst")
    parts, n = dst.shape[0], free_elems(d)
    operands = {"dst": d}
    lo, hi = _bound(min, "min", parts, o, operands), _bound(max, "max", parts, o, operands)
    if not (lo < hi).all():
        fail("min must be < max", o, "min")
    store(d, lo + _uniform("vector", parts, n) * (hi - lo))
    return record(o, "vector", operands, name=name, partitions=parts, free_elems=n)


def dropout(dst, data, prob, name=None):
    """VectorE: dst = data, with each element replaced by 0 with probability ``prob`` (a number
    or a [P, 1] tile of per-partition probabilities)."""
    o = "dropout"
    d, x = on_chip(dst, o, "dst"), on_chip(data, o, "data")
    parts = dst.shape[0]
    if data.shape[0] != parts or free_elems(d) != free_elems(x):
        fail(f"dst {dst.shape} and data {data.shape} must have the same partitions and elements",
             o, "dst")
    if dst.dtype != data.dtype:
        fail(f"dst dtype {dst.dtype.name} must equal data's {data.dtype.name}", o, "dst")
    operands = {"dst": d, "data": x}
    if isinstance(prob, ndarray):
        if dtypes.is_int(data.dtype) and prob.dtype != dtypes.float32:
            fail(f"prob dtype {prob.dtype.name} must be float32 for integer data", o, "prob")
        if not dtypes.is_float(prob.dtype):
            fail(f"prob dtype {prob.dtype.name} must be a float type", o, "prob")
    p = _bound(prob, "prob", parts, o, operands)
    if ((p < 0) | (p > 1)).any():
        fail("prob must be in [0, 1]", o, "prob")
    n = free_elems(x)
    keep = _uniform("vector", parts, n) >= p
    values = as_2d(x.read())
    d.write(np.where(keep, values, np.zeros((), values.dtype)).reshape(d.shape))
    return record(o, "vector", operands, name=name, partitions=parts, free_elems=n)


def set_rng_seed(src_seeds, name=None):
    """Reseed every VectorE lane from one 32-bit value ([1, 1] tile in SBUF or PSUM)."""
    o = "set_rng_seed"
    s = on_chip(src_seeds, o, "src_seeds")
    if src_seeds.shape[0] != 1 or free_elems(s) != 1 or src_seeds.dtype.itemsize != 4:
        fail(f"src_seeds must be a [1, 1] 32-bit tile, got {src_seeds.shape} "
             f"{src_seeds.dtype.name}", o, "src_seeds")
    seed = int(as_2d(s.read()).view(np.uint32)[0, 0])
    _states("vector")[:] = _seeded(seed, "vector", context.current().target.pmax)
    return record(o, "vector", {"src_seeds": s}, name=name, partitions=1, free_elems=1)


def _state_engine(engine, op):
    target = context.current().target
    if target.nc_version < 3:
        context.fail(TargetError, f"{op} needs NeuronCore-v3+ (target {target.name})", op=op)
    eng = engine_name(engine, "gpsimd", ("gpsimd", "vector"), op)
    if eng == "vector" and target.nc_version < 4:
        context.fail(TargetError, f"{op} on VectorE needs NeuronCore-v4+ (target {target.name})",
                     op=op, operand="engine")
    return eng


def rand_set_state(src_seeds, engine=engine_enum.gpsimd, name=None):
    """Set each lane's PRNG state from its partition of ``src_seeds`` (uint32, 6 words for GpSimd,
    24 for VectorE)."""
    o = "rand_set_state"
    eng = _state_engine(engine, o)
    s = on_chip(src_seeds, o, "src_seeds", ("sbuf",))
    if src_seeds.dtype != dtypes.uint32 or free_elems(s) != WORDS[eng]:
        fail(f"src_seeds must be uint32 with {WORDS[eng]} words per partition for {eng}, got "
             f"{src_seeds.shape} {src_seeds.dtype.name}", o, "src_seeds")
    parts = src_seeds.shape[0]
    _states(eng)[:parts] = as_2d(s.read()).astype(np.uint64)
    return record(o, eng, {"src_seeds": s}, name=name, partitions=parts, free_elems=WORDS[eng])


def rand_get_state(dst, engine=engine_enum.gpsimd, name=None):
    """Write each lane's PRNG state into its partition of ``dst`` (uint32)."""
    o = "rand_get_state"
    eng = _state_engine(engine, o)
    d = on_chip(dst, o, "dst", ("sbuf",) if eng == "gpsimd" else ("sbuf", "psum"))
    if dst.dtype != dtypes.uint32 or free_elems(d) != WORDS[eng]:
        fail(f"dst must be uint32 with {WORDS[eng]} words per partition for {eng}, got "
             f"{dst.shape} {dst.dtype.name}", o, "dst")
    parts = dst.shape[0]
    d.write(_states(eng)[:parts].astype(np.uint32).reshape(d.shape))
    return record(o, eng, {"dst": d}, name=name, partitions=parts, free_elems=WORDS[eng])
