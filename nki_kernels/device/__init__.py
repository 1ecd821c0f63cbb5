"""The Trainium path: kernels run through ``nki.jit`` on a NeuronCore, validated against their
references (``validate``), measured with ``nki.benchmark`` (``measure``), and the cost model's
assumed constants fitted to the measurements (``fit``). ``rehearse`` stands in for the Neuron
SDK on a CPU (``NKI_KERNELS_REHEARSE=1``) so the whole path runs in CI."""
