"""The GPU runtime: the only host<->device path (mapped pinned memory), CUDA graphs, the ISV signal bus."""
