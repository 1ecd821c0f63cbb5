"""Run every kernel at realistic sizes in the simulator and write benchmarks/results/bench.{md,json}.

    python3 benchmarks/run.py [--targets trn1 trn2]      # same as `nki-kernels bench`
"""

import sys

from nki_kernels.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench"] + (sys.argv[1:] or ["--targets", "trn1", "trn2"])))
