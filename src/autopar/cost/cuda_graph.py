"""CUDA graphs in training (``TrainSpec.cuda_graph_impl`` / ``cuda_graph_scope``): launch overhead
removed, static buffers added.

Megatron-LM core_v0.15 (``arguments.py``, ``--cuda-graph-impl {none, local, transformer_engine}``,
``--cuda-graph-scope`` one or more of ``attn mlp moe moe_router moe_preprocess full_iteration``,
default the whole transformer layer; the deprecated ``--enable-cuda-graph`` is ``local`` and
``--external-cuda-graph`` is ``transformer_engine``): ``transformer_engine`` captures each chosen
part of every decoder layer with TE ``make_graphed_callables`` (one forward and one backward graph
per layer and micro-batch), ``local`` captures whole layers with Megatron's ``CudaGraphManager``,
or with ``full_iteration`` the whole forward-backward step with ``FullCudaGraphWrapper``
("full_iteration scope is only supported with --cuda-graph-impl=local, other scopes are only
supported with --cuda-graph-impl=transformer_engine").

* **Time.** A graph replay is one host launch for all the kernels it holds (NVIDIA, "CUDA Graph
  Best Practice for PyTorch"; Megatron-Bridge "CUDA Graphs": "the main benefit is lower host-side
  launch overhead"). In autopar's host model (:mod:`autopar.cost.host`) the host issues
  ``host_op_s`` per op and a micro-batch takes ``max(GPU, host)``; a graphed part of a layer costs
  :data:`GRAPH_LAUNCH_OPS` op per pass instead of its forward ops (and their backward ops plus
  weight-gradient GEMMs), :func:`layer_ops`. ``full_iteration`` removes the decoder layers' host
  time altogether. The GPU time is unchanged: the kernels' own cost (``KERNEL_OVERHEAD_S``:
  launch latency and tails on the device) stays. ``moe_preprocess`` graphs the dispatcher's
  preprocessing, which the host model does not separate from the dispatch: it saves nothing here
  (an upper bound on the time).
* **Memory.** A captured graph reads and writes fixed (static) tensors, allocated for every
  micro-batch whose graph can be replayed while others are in flight (TE ``make_graphed_callables``
  with Megatron's ``_order`` of the pipeline schedule), from a pool the eager allocator cannot
  reuse. Per graphed layer and micro-batch in flight autopar counts :data:`STATIC_BUFFERS` static
  tensors of the layer's hidden state (``s/cp * b * h``, SP-sharded): the forward graph's input
  and the backward graph's incoming gradient; the intermediate activations are the ones the
  layer saves anyway. Check against Megatron-Bridge's guide ("graph capture allocates static
  buffers, typically adding a few GB. Models with PP > 1 can consume over 10 GB of additional
  memory"): Llama-3-8B, seq 8192, tp 1, pp 1: 2 x 64 MiB x 32 layers = 4 GiB; Llama-3-70B, tp 4,
  pp 4 (20 layers per stage, 4 micro-batches in flight on the first): 2 x 32 MiB x 20 x 4 = 5 GiB
  (+ the same again with vpp 5's extra chunks in flight).

Units: host ops (counts), bytes; arrays over layouts.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import activations as act
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

GRAPH_LAUNCH_OPS = 1  # one cudaGraphLaunch per graphed part and pass
STATIC_BUFFERS = 2  # forward input + backward incoming gradient per graphed layer and micro-batch


def graphed_parts(p: Problem, moe: bool) -> set[str]:
    """Parts of a dense (``moe=False``) or MoE layer the graphs capture: ``attn``, ``mlp`` (the
    dense MLP, or the whole MoE block), ``router`` (a MoE block up to its router); all of them
    with ``full_iteration`` or the default whole-layer scope; none without CUDA graphs."""
    train = p.train
    if train.cuda_graph_impl == "none":
        return set()
    scope = set(train.cuda_graph_scope)
    if not scope or "full_iteration" in scope:
        return {"attn", "mlp"}
    parts = {"attn"} & scope
    if ("moe" if moe else "mlp") in scope:
        parts.add("mlp")
    if moe and "moe_router" in scope:
        parts.add("router")
    return parts


def layer_ops(p: Problem, forward_ops: dict[str, np.ndarray], gemm_launches: dict[str, np.ndarray],
              moe: bool) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) host ops of one layer pass with the graphs of :func:`graphed_parts`.

    Args:
        forward_ops: forward host ops of each part, ``attn``, ``mlp`` and (MoE) ``router`` (a
            share of ``mlp``), as :func:`autopar.cost.host.forward_ops_by_part` counts them.
        gemm_launches: weight-gradient GEMMs each part adds in backward, same keys.

    Eager: forward = attn + mlp, backward = forward + GEMMs. A graphed part is one launch in each
    pass; ``full_iteration``: no host op at all. Example: a dense layer of 20 forward ops (8 attention,
    12 MLP with its collectives) and 4 GEMMs (2 + 2), attention graphed: forward 1 + 12 = 13,
    backward 1 + 12 + 2 = 15.
    """
    if p.train.cuda_graph_impl != "none" and "full_iteration" in p.train.cuda_graph_scope:
        zero = np.zeros_like(forward_ops["attn"], dtype=np.float64)
        return zero, zero
    parts = graphed_parts(p, moe)
    forward = np.zeros_like(forward_ops["attn"], dtype=np.float64)
    backward = np.zeros_like(forward)
    mlp_graphed = "mlp" in parts
    for name in ("attn", "mlp"):
        ops, gemms = forward_ops[name], gemm_launches[name]
        if name in parts:
            forward, backward = forward + GRAPH_LAUNCH_OPS, backward + GRAPH_LAUNCH_OPS
            continue
        if name == "mlp" and "router" in parts and not mlp_graphed:
            router, router_gemms = forward_ops["router"], gemm_launches["router"]
            ops = ops - router + GRAPH_LAUNCH_OPS
            gemms = gemms - router_gemms
        forward = forward + ops
        backward = backward + ops + gemms
    return forward, backward


def graphs_per_layer(p: Problem, moe: bool) -> int:
    """Graphs captured per layer (each with its static tensors): one for the whole layer (the
    default scope, ``local``, ``full_iteration``), else one per graphed part."""
    if p.train.cuda_graph_impl == "none":
        return 0
    scope = p.train.cuda_graph_scope
    if not scope or "full_iteration" in scope:
        return 1
    return len(graphed_parts(p, moe))


def static_buffer_bytes(p: Problem, batch: LayoutBatch, n_dense: np.ndarray, n_moe: np.ndarray,
                        in_flight: np.ndarray) -> np.ndarray:
    """Static graph tensors on a stage of ``n_dense`` dense and ``n_moe`` MoE layers with
    ``in_flight`` micro-batches at its peak (:func:`autopar.cost.memory.in_flight_microbatches`):
    :data:`STATIC_BUFFERS` hidden states per graph (:func:`graphs_per_layer`) and micro-batch
    (module docstring); 0 without CUDA graphs. Llama-3-8B, seq 8192, mbs 1, tp 1, 32 layers, one
    micro-batch: 2 x 8192 x 4096 x 2 B x 32 = 4 GiB."""
    if p.train.cuda_graph_impl == "none":
        return np.zeros(len(batch))
    graphs = n_dense * graphs_per_layer(p, False) + n_moe * graphs_per_layer(p, True)
    return STATIC_BUFFERS * act.layer_input_bytes(p, batch) * graphs * in_flight
