"""The autograd stage: ATen-level forward and backward graphs, functionalized and partitioned.

    aot_compile(gm, example_inputs, compiler, *, decompositions=None, name="graph", cache=None) -> callable
        The code generator's entry point. `compiler(aten_gm, fake_example_inputs)` is called
        with the inference graph, or with the forward and the backward graph separately
        (`aten_gm.meta["kiln.aot"]["kind"]` is "inference", "forward" or "backward"); it
        returns a callable over the graph's flat positional inputs, or over one list of them
        if it sets `_boxed_call = True`. The result takes `gm`'s inputs and returns `gm`'s
        output structure; its `traces`, `partitions` and `runners` show what was built. With `cache`
        (the compiler's identity and options) each variant's graphs are kept in the compile cache and
        taken from it by a later compile of the same captured graph (aot_cache.py).
    aot_eager(gm, example_inputs)
        The "aot_eager" backend: the same ATen graphs, run op by op.
    decompositions.core_aten()
        PyTorch's table down to core ATen, for a code generator's `decompositions=`.

See aot.py for the order of the passes and the RNG behaviour.
"""
from kiln.autograd.aot import aot_compile, aot_eager

__all__ = ["aot_compile", "aot_eager"]
