"""Printers: the schedule of one ATen graph as kernel source and a wrapper (the host program).

    target.py        which printer a graph gets (C++ for CPU tensors, Triton for CUDA tensors), its options bound
    cpp/             C++/OpenMP kernels, one translation unit per graph, built by kiln/runtime/cache.py
    triton/          Triton kernels and their launchers, one Python module per graph
    wrapper.py       the host program: allocates, calls kernels and extern ATen ops in order, frees
    describe.py      kernel names after what they fuse, and the fused graph
    index_printer.py, cse.py   shared by both targets

The pipeline that runs them (decompose, lower, schedule, plan memory, generate, build) is kiln/pipeline.py.
"""
