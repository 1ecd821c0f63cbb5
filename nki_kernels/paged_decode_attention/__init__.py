"""The former name of ``nki_kernels.paged_attention`` (it holds prefill too), kept as an alias
for a while: the same public names, the same objects."""

from nki_kernels.paged_attention import *  # noqa: F401,F403
from nki_kernels.paged_attention import __all__  # noqa: F401
