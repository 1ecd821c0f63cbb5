"""Logical NeuronCore size (LNC) of a launch: checked on the host, read inside a kernel.

On trn2 a logical core is two physical NeuronCores by default (LNC=2): ``kernel[2](...)`` runs
two program instances, one per physical core, sharing HBM. trn1 has one core per logical core.
"""

from __future__ import annotations

from nki_kernels.backend import ON_HARDWARE, nisa, nl


def check_lnc(lnc) -> int:
    """Host side: ``lnc`` must be 1 or 2, and 2 needs a NeuronCore-v3+ target (in the simulator,
    the selected target; on a device the runtime refuses it)."""
    if isinstance(lnc, bool) or lnc not in (1, 2):
        raise ValueError(f"lnc={lnc!r} must be 1 or 2 (logical NeuronCore size: 2 shares the "
                         f"work between the two physical cores of a trn2 logical core)")
    if lnc == 2 and not ON_HARDWARE:
        from nki_kernels.simulate.targets import get_target
        target = get_target()
        if target.nc_version < 3:
            raise ValueError(f"lnc=2 needs a NeuronCore-v3+ target (trn2): {target.name} has one "
                             f"physical core per logical core")
    return int(lnc)


def host_nc_version() -> int:
    """Host side: the NeuronCore version the next launch runs on (the selected simulator target;
    on a device, 3: trn2, the SDK's primary target from Neuron 2.29), for plans whose best shape
    depends on it."""
    if ON_HARDWARE:
        return 3
    from nki_kernels.simulate.targets import get_target
    return get_target().nc_version


def program_cores() -> int:
    """Inside a kernel: how many cores this launch spans (1, or 2 under LNC=2 on NeuronCore-v3+;
    refused on NeuronCore-v2, which has no two-core logical core)."""
    cores = nl.num_programs(0)
    assert cores == 1 or nisa.get_nc_version() >= 3, (
        "lnc=2 needs a NeuronCore-v3+ target (trn2): trn1 has one physical core per logical core")
    return cores
