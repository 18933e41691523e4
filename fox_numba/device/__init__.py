"""The GPU runtime: the only host<->device path (mapped pinned memory), CUDA graphs, the ISV signal bus.

    runtime   simulator or GPU, streams, array addresses
    launch    launch helpers: grids from element counts, explicit stream, argument checks, launch traces
    memory    Mapped (mapped pinned) buffers, typed constructors, device arrays, device-to-device copies
    staging   Stager: bulk uploads and downloads through double-buffered mapped chunks
    control   ControlBlock: per-step scalars (step, seed, lr_sched, tau_eff, eps) for graphs
    graphs    StepGraph: a step body captured into a CUDA graph and replayed, or run eagerly
    fork      SideStream: work of a step forked onto a second stream and joined back (graph branches)
    isv       the ISV slot table, its fingerprint and generated docs (ISV_SLOTS.md), IsvBus
    rng       xoroshiro128+ generator states built on the host
    timing    named regions and kernels timed with CUDA events (wall clock under the simulator)
    hold      StreamHold: a busy kernel that holds a stream while the host enqueues launches to be timed
    mps       a private CUDA MPS control daemon, so several runs' kernels share one GPU at once
    kernel_cache  compiled kernels kept on disk between runs of the same code
    registry  every @cuda.jit kernel of the package and its signatures (compiled for sm_90 in CI)
    elementwise  the runtime's own kernels: fill, copy, scale, axpy, scatter

Layering: device/ imports nothing above it (not kernels/, not the stages); everything else imports device/.
"""
