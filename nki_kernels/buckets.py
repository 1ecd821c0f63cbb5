"""Shape buckets: how host wrappers choose the static shapes the kernels are compiled for.

``nki.jit`` compiles once per (shapes, dtypes, non-tensor arguments). A serving loop changes its
batch, its total page count and its tokens per step all the time; padding each of them up to a
bucket keeps the number of distinct programs small (one compile per bucket, reused ever after).

Policy (``BucketPolicy``): a size n is padded to the smallest bucket >= n from a geometric ladder
``minimum, minimum*growth, ...`` (default powers of two from 1). Padding moves no HBM data:
padded requests have length 0 and padded tokens are skipped. Device loops run no work for them;
a small decode bucket's static pass (``paged_attention.work.static_pass``) computes its padding
rows like real ones (12 requests in a bucket of 16: a quarter of its compute). A larger
``growth`` means fewer compiles and more padding. Set the process-wide policy with
``set_bucket_policy`` or the environment variable
``NKI_KERNELS_BUCKETS="minimum,growth"`` (e.g. ``"8,2"``); ``BucketPolicy(exact=True)`` turns
bucketing off (one compile per distinct size, as before).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

ENV = "NKI_KERNELS_BUCKETS"


@dataclass(frozen=True)
class BucketPolicy:
    minimum: int = 1
    growth: float = 2.0
    exact: bool = False

    def __post_init__(self):
        if int(self.minimum) != self.minimum or self.minimum < 1:
            raise ValueError(f"bucket minimum={self.minimum} must be an integer >= 1")
        if not self.growth > 1:
            raise ValueError(f"bucket growth={self.growth} must be > 1")

    def bucket(self, n: int) -> int:
        """The padded size for a real size ``n`` (n >= 0; 0 pads to the minimum)."""
        n = int(n)
        if n < 0:
            raise ValueError(f"size {n} must be >= 0")
        if self.exact:
            return max(n, 1)
        b = int(self.minimum)
        while b < n:
            b = max(b + 1, int(b * self.growth))
        return b


def _from_env() -> BucketPolicy:
    text = os.environ.get(ENV, "").strip()
    if not text:
        return BucketPolicy()
    if text == "exact":
        return BucketPolicy(exact=True)
    try:
        minimum, growth = text.split(",")
        return BucketPolicy(int(minimum), float(growth))
    except ValueError as err:
        raise ValueError(f"{ENV}={text!r} must be 'minimum,growth' (e.g. '8,2') or 'exact'") from err


_policy = _from_env()


def bucket_policy() -> BucketPolicy:
    return _policy


def set_bucket_policy(policy: BucketPolicy) -> BucketPolicy:
    """Install ``policy`` for every wrapper; returns the previous one."""
    global _policy
    if not isinstance(policy, BucketPolicy):
        raise TypeError(f"policy must be a BucketPolicy, got {type(policy).__name__}")
    previous, _policy = _policy, policy
    return previous


def bucket(n: int) -> int:
    return _policy.bucket(n)


def bucket_floor(b: int) -> int:
    """The least size n >= 1 the current policy pads to bucket ``b`` (``bucket(n) == b``): what
    a launch of that bucket is sure to hold, so a kernel may fold that many items without a
    device loop and still compile once per bucket. ``b`` itself when no size pads to it."""
    b = int(b)
    low = 1
    while low < b and _policy.bucket(low) != b:
        low = min(b, _policy.bucket(low) + 1)
    return low


TAIL_ENV = "NKI_KERNELS_TAIL_SLOTS"
TAIL_SLOTS = (1, 2, 3, 4, 8)
# The tail sizes a launch chooses between by default: two, three, four or eight slots (prompts'
# first chunks take two or three, long prefixes eight; ``paged_attention.work.unit_tail_slots``);
# one slot only when set (eight one-chunk units: 86.2 us with two, 75.7 with one). Cost model,
# trn2, LNC=2, the chunked replays' prefill launches against four slots alone: chunks of 64
# -4.2%, of 128 -2.7% with (2, 4, 8); sizes (1, 2, 4, 8) -4.5% and -1.6%. Three: units of two
# to three chunks (eight prompts of 256 over 270-381 keys 573.5 -> 509.0 us LNC=1; 12 x 96 over
# 100-1000 471.8 -> 455.9); six was worse (its units then loop less but score empty slots:
# 12 x 96 on two cores 235.1 -> 267.5). At most four compiles a bucket.
DEFAULT_TAIL_SLOTS = (2, 3, 4, 8)


def tail_slots_mode():
    """The tail sizes a chunked-prefill launch chooses between by its units' cost
    (``paged_attention.work.unit_tail_slots``; 1, 2, 4 or 8 chunk slots, at most what the
    launch's shape allows), a bucket compiling once per size it meets: unset,
    DEFAULT_TAIL_SLOTS; ``NKI_KERNELS_TAIL_SLOTS`` one size ("4": one compile per bucket), a
    comma list ("4,8"), or ``"launch"``: all of them."""
    text = os.environ.get(TAIL_ENV, "").strip()
    if not text:
        return DEFAULT_TAIL_SLOTS
    if text == "launch":
        return TAIL_SLOTS
    sizes = tuple(part.strip() for part in text.split(","))
    if not all(size in tuple(str(s) for s in TAIL_SLOTS) for size in sizes):
        raise ValueError(f"{TAIL_ENV}={text!r} must be 'launch' or sizes among "
                         f"{', '.join(str(s) for s in TAIL_SLOTS)} (comma-separated)")
    return tuple(sorted(set(int(size) for size in sizes)))


PROFILE_ENV = "NKI_KERNELS_TAIL_PROFILE"
PROFILE_MODES = ("lead", "ladder", "exact", "off")


def tail_profile_mode() -> str:
    """How a chunked-prefill launch's whole units size their tails per unit
    (``paged_attention.work.tail_profile``): ``NKI_KERNELS_TAIL_PROFILE`` unset or "lead":
    under LNC=2 the lead groups' shorter units take half the slots (a few programs more
    a bucket; LNC=1 as "off"); "ladder": on one core or two, each lead group position
    the least of its group's size and 3/4, 1/2 and 3/8 of it that holds its units (more
    programs, fewer empty slots); "exact": every unit position the slots its units need
    (fastest, but about a program for each new length pattern: for batches whose shapes
    repeat); "off": one size a group."""
    text = os.environ.get(PROFILE_ENV, "").strip() or "lead"
    if text not in PROFILE_MODES:
        raise ValueError(f"{PROFILE_ENV}={text!r} must be one of {', '.join(PROFILE_MODES)}")
    return text


PROGRAMS_ENV = "NKI_KERNELS_TAIL_PROGRAMS"


def tail_programs() -> int:
    """Exact tail profiles a bucket of chunked-prefill launches may add in this process
    (``paged_attention.tail_programs``): ``NKI_KERNELS_TAIL_PROGRAMS`` unset or 0: none (the
    profile mode's programs alone); K: a launch takes the sizes its units need while its
    bucket has made fewer than K such programs, or one made before that holds them."""
    text = os.environ.get(PROGRAMS_ENV, "").strip() or "0"
    if not text.isdigit():
        raise ValueError(f"{PROGRAMS_ENV}={text!r} must be a whole number of programs (0: none)")
    return int(text)


LEAD_ENV = "NKI_KERNELS_LEAD"
LEAD_MODES = ("bucket", "launch")


def lead_mode() -> str:
    """How many whole units a chunked-prefill launch folds per core without a device loop
    (``paged_attention.work.launch_lead``): ``NKI_KERNELS_LEAD`` unset or "bucket": what every
    launch of its bucket holds (one program a bucket); "launch": that, or the level halfway
    to the bucket's top, or the top, whichever this launch's units reach (up to three
    programs a bucket, fewer loop iterations)."""
    text = os.environ.get(LEAD_ENV, "").strip() or "bucket"
    if text not in LEAD_MODES:
        raise ValueError(f"{LEAD_ENV}={text!r} must be one of {', '.join(LEAD_MODES)}")
    return text


SECTIONS_ENV = "NKI_KERNELS_STATIC_SECTIONS"


def static_sections_mode(default: int):
    """(most sections, whether any split may be taken) of a decode static pass
    (``paged_attention.work.static_sections``: each section a compile-time row count and chunk
    count). Unset: up to ``default`` sections from the fixed menu
    ``work.STATIC_SECTION_TEMPLATES`` (a bounded set of programs a bucket); a number caps the
    sections (1: one section, the fewest compiles); ``any``: up to ``default``, any split the
    cost model prices lowest (a little faster on spread batches, a compile per split met)."""
    text = os.environ.get(SECTIONS_ENV, "").strip()
    if not text:
        return default, False
    if text == "any":
        return default, True
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{SECTIONS_ENV}={text!r} must be 'any' or a whole number of "
                         f"sections, 1 or more")
    return int(text), False


# Every setting above that the host's planning reads: a plan made under one is not another's
# (``paged_attention.plan_cache`` keys on their values)
PLANNING_SETTINGS = (ENV, TAIL_ENV, SECTIONS_ENV, PROFILE_ENV, PROGRAMS_ENV, LEAD_ENV)


def pad_rows(a, rows: int):
    """``a`` with zero rows appended along dim 0 up to ``rows`` (a NumPy array or a torch
    tensor; returned as is when already that long)."""
    extra = rows - a.shape[0]
    if extra == 0:
        return a
    pad = (extra,) + tuple(a.shape[1:])
    if isinstance(a, np.ndarray):
        return np.concatenate([np.ascontiguousarray(a), np.zeros(pad, a.dtype)])
    import torch
    return torch.cat([a.contiguous(), a.new_zeros(pad)])
