"""The MoE token dispatchers of Megatron-Core, their kernels, and what hides their communication.

Dispatchers (``Strategy.moe_dispatcher``; Megatron-Core ``transformer/moe/token_dispatcher.py``),
per MoE layer and micro-batch, one pass = dispatch + combine (the backward pass repeats it):

* ``alltoall`` (``MoEAlltoAllTokenDispatcher``): the ``n*k/shard`` permuted token copies of the SP
  shard go to their experts' ranks by NCCL all-to-all over the ``ep`` group, all-gathered over
  ``etp`` (:func:`autopar.cost.moe.all_to_all_s`); one copy per (token, expert) crosses the wire.
* ``allgather`` (``MoEAllGatherTokenDispatcher``): every rank all-gathers the hidden states of its
  ``ep x etp`` group and keeps the tokens of its local experts; the combine is a reduce-scatter.
  The volume is the whole group's tokens, whatever ``k``.
* ``deepep`` / ``hybridep`` (``MoEFlexTokenDispatcher``, ``--moe-token-dispatcher-type flex
  --moe-flex-dispatcher-backend``; ``fused_a2a.py``): DeepEP's normal kernels send a token once to
  each *node* that holds one of its experts over RDMA and forward it to the experts' GPUs over
  NVLink (DeepEP README, "Normal kernels with NVLink and RDMA forwarding"), so the inter-node bytes
  are the token times the distinct remote nodes it visits, not ``k`` copies. Achieved bandwidths
  from DeepEP's published table (``deepseek-ai/DeepEP`` ``docs/legacy.md``, H800 with ~160 GB/s
  NVLink and CX7 400 Gb/s InfiniBand, ~50 GB/s): intranode EP 8 153 / 158 GB/s (dispatch /
  combine) = :data:`DEEPEP_NVLINK_FRACTION` of the link; internode EP 16/32/64 43-58 GB/s of RDMA
  payload per ~50 GB/s NIC: :data:`DEEPEP_RDMA_FRACTION`. DeepEP's intranode kernels reach at most
  :data:`DEEPEP_MAX_NVL_PEERS` GPUs (``NUM_MAX_NVL_PEERS``); HybridEP (DeepEP's ``hybrid-ep``
  branch, Megatron-LM DeepSeek-V3 GB200 guide) forwards over the whole NVLink domain (an NVL72
  rack) with the same kernels' fractions. The token permutation is fused into the flex path.

Kernels beside the GEMMs (GPU launches and host ops): the router (``router.py``) and the
permutation (``moe_utils.permute`` / ``unpermute``) run as fused Transformer Engine kernels with
``MoeRuntime.router_fusion`` (``fused_topk_with_score_function``,
``fused_compute_score_for_moe_aux_loss``) and ``permute_fusion`` (``moe_permute`` /
``moe_unpermute``); unfused they are PyTorch op sequences, and the unfused permutation makes an
extra pass over the token copies (an index gather, then the copy; a scatter-add back).

What hides the communication (:func:`exposed_layer_comm_s`):

* nothing (default): the expert GEMMs need the dispatched tokens, the combine output feeds the
  residual, and the alltoall dispatcher waits for the token counts (a device-to-host copy).
* ``MoeRuntime.shared_expert_overlap`` (``--moe-shared-expert-overlap``, ``shared_experts.py``):
  the shared experts run on a side stream during dispatch and combine: each pass hides up to the
  shared experts' time of that pass.
* ``Strategy.moe_ep_overlap`` (``--overlap-moe-expert-parallel-comm``, Megatron-Core 0.14
  ``pipeline_parallel/combined_1f1b.py``): the forward of one micro-batch and the backward of
  another are interleaved layer by layer, each's dispatch/combine under the other's compute: the
  forward pass's communication hides under the partner's layer backward (2x forward), the
  backward's under the partner's layer forward, plus with ``MoeRuntime.delay_wgrad``
  (``--delay-wgrad-compute``) the experts' weight-gradient GEMMs, which then run under the
  backward combine. Micro-batches without a partner (the pipeline's warm-up forwards and
  cool-down backwards, ``min(1, pp / m)`` of them) keep their communication exposed.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import comm
from autopar.cost import flops as F
from autopar.cost import moe as moe_cost
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

DEEPEP_NVLINK_FRACTION = 153.0 / 160.0  # DeepEP intranode EP8 dispatch on H800's ~160 GB/s NVLink
DEEPEP_RDMA_FRACTION = 1.0  # DeepEP internode 43-58 GB/s RDMA payload per ~50 GB/s CX7 NIC (forwarding dedup)
DEEPEP_MAX_NVL_PEERS = 8  # DeepEP csrc/kernels/configs.cuh NUM_MAX_NVL_PEERS: NVLink forwarding within 8 GPUs

# GPU kernels per MoE layer forward beside the GEMMs: router (gate softmax/sigmoid, top-k, routing
# map and probability scatters, aux-loss scores) and permutation (permute, unpermute and the
# local chunk sorts). Unfused router + fused permutation is the 12 autopar used before.
ROUTER_KERNELS = {False: 8, True: 2}
PERMUTE_KERNELS = {False: 8, True: 4}
# Host ops of the fused router: gate GEMM, fused top-k with score function, fused aux-loss scores,
# fused aux loss, token-count all-reduce, aux-loss scaler and tracker (7; unfused: autopar.cost.host).
ROUTER_FUSED_HOST_OPS = 7
# Host ops the unfused permutation adds to the fused one (autopar.cost.host.DISPATCH_OPS counts the
# fused): routing-map transpose, index arange/expand/masked_select and index_select per direction.
PERMUTE_UNFUSED_EXTRA_HOST_OPS = 8


def extra_kernels(p: Problem) -> int:
    """GPU kernels of one MoE layer forward beside its GEMMs (router + permutation, module docstring)."""
    moe = p.train.moe
    return ROUTER_KERNELS[moe.router_fusion] + PERMUTE_KERNELS[moe.permute_fusion]


def permute_passes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Passes over the token copies per permute/unpermute: 1 fused (TE kernels, and always on the
    flex dispatchers), 2 unfused (an index gather before the copy)."""
    flex = batch.dispatcher_is("deepep") | batch.dispatcher_is("hybridep")
    return np.where(flex | p.train.moe.permute_fusion, 1.0, 2.0)


def sort_chunks_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Forward HBM bytes of the ``alltoall`` dispatcher's second permutation per MoE layer and
    micro-batch: with more than one local expert, the received copies arrive grouped by source
    rank and are regrouped by local expert (``token_dispatcher.py`` ``dispatch_postprocess``,
    "Permutation 2: Sort tokens by local expert", ``sort_chunks_by_idxs``; TE's fused
    ``moe_sort_chunks_by_index`` with ``MoeRuntime.permute_fusion``), and back before the combine
    (``combine_preprocess``): a read and a write of the busiest rank's ``rows x h`` bf16 copies
    each way, ``2 x 2 x 2 B x rows x h`` (the kernels are in :data:`PERMUTE_KERNELS`). Zero for the
    other dispatchers (the flex dispatchers permute once, after the dispatch; ``allgather``
    masks) and with one local expert. Qwen3-30B-A3B, 8192 tokens, top-8, ep 8 (16 local
    experts): 8 x 65536 x 2048 B = 1.07 GB."""
    local = p.model.num_experts / batch.ep
    rows = moe_cost.expert_rows(p, batch)
    sorted_copies = F.BF16 * 2 * 2 * rows * p.model.hidden_size
    return np.where(batch.dispatcher_is("alltoall") & (local > 1), sorted_copies, 0.0)


def _copy_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Bytes of the token copies one rank sends in a dispatch (bf16, ``n*k/shard`` rows of h), times
    the routing factor of the busiest rank (:func:`autopar.cost.moe.token_factor`)."""
    m = p.model
    return F.BF16 * moe_cost.tokens(p, batch) * m.num_experts_per_tok * m.hidden_size / moe_cost.sp_shard(batch) \
        * moe_cost.token_factor(p.train)


def remote_nodes_per_token(p: Problem, nodes: np.ndarray) -> np.ndarray:
    """Expected distinct other nodes a token's ``k`` experts sit on when its experts are spread
    evenly over ``nodes`` nodes: ``(N - 1) * (1 - (1 - 1/N)^k)`` (k independent picks); at most
    the router's ``group_topk`` groups less the own node where routing is group-limited
    (DeepSeek-V3 node-limited routing, report sec. 2.1.2)."""
    k = p.model.num_experts_per_tok
    nodes = np.maximum(np.asarray(nodes, dtype=np.float64), 1.0)
    remote = (nodes - 1.0) * (1.0 - (1.0 - 1.0 / nodes) ** k)
    if p.model.router_group_topk:
        remote = np.minimum(remote, max(p.model.router_group_topk - 1, 1))
    return remote


def flex_a2a_s(p: Problem, batch: LayoutBatch, domain: np.ndarray) -> np.ndarray:
    """One DeepEP/HybridEP dispatch (or combine) with NVLink forwarding inside ``domain`` GPUs.

    The ``ep`` members are ``etp`` ranks apart (Megatron's expert rank order); ``m`` of them share
    a forwarding domain. Within it the copies for the other ``m - 1`` members cross NVLink; each
    token goes once to each remote domain it has an expert in (:func:`remote_nodes_per_token`)
    over the rank's NIC, and is forwarded there. Both at the DeepEP fractions, concurrently."""
    ep = batch.ep.astype(np.float64)
    local = np.clip(np.floor(domain / batch.etp), 1, ep)
    domains = np.ceil(ep / local)
    copy_bytes = _copy_bytes(p, batch)
    token_bytes = copy_bytes / p.model.num_experts_per_tok
    dev = p.cluster.device
    nvlink = (local - 1) / ep * copy_bytes / (dev.intra_node_bandwidth_bytes_per_s * DEEPEP_NVLINK_FRACTION)
    rdma = remote_nodes_per_token(p, domains) * token_bytes / (dev.inter_node_bandwidth_bytes_per_s
                                                               * DEEPEP_RDMA_FRACTION)
    latency = np.where(domains > 1, dev.inter_node_latency_s, dev.intra_node_latency_s)
    return np.where(ep > 1, np.maximum(nvlink, rdma) + latency, 0.0)


def pass_comm_s(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """EP/ETP communication of one MoE layer pass (dispatch + combine) per micro-batch, by the
    layout's dispatcher (module docstring); the etp all-gather / reduce-scatter of the expert
    inputs and outputs is added for every dispatcher but ``allgather`` (whose group includes etp)."""
    h = p.model.hidden_size
    etp = comm.all_gather_s(p, F.BF16 * moe_cost.expert_rows(p, batch) * h, batch.etp, 1)
    alltoall = moe_cost.all_to_all_s(p, batch)
    group = batch.ep * batch.etp
    gathered = F.BF16 * moe_cost.tokens(p, batch) / moe_cost.sp_shard(batch) * h * group
    allgather = comm.all_gather_s(p, gathered, group, 1)
    deepep = flex_a2a_s(p, batch, np.minimum(p.cluster.fast_domain_size, DEEPEP_MAX_NVL_PEERS))
    hybridep = flex_a2a_s(p, batch, np.full(len(batch), p.cluster.fast_domain_size))
    one_way = np.select([batch.dispatcher_is("allgather"), batch.dispatcher_is("deepep"),
                         batch.dispatcher_is("hybridep")], [allgather - etp, deepep, hybridep], alltoall)
    return 2 * (one_way + etp)


def exposed_layer_comm_s(p: Problem, batch: LayoutBatch, layer_forward_s: np.ndarray, shared_forward_s: np.ndarray,
                         expert_wgrad_s: np.ndarray, one_pass_s: np.ndarray | None = None) -> np.ndarray:
    """EP communication of one MoE layer (forward + backward passes) per micro-batch left exposed
    after the overlaps of the module docstring.

    Args:
        layer_forward_s: the MoE layer's forward compute (its partner micro-batch's, the same).
        shared_forward_s: the shared experts' forward compute (0 without shared experts).
        expert_wgrad_s: the routed experts' weight-gradient GEMMs (about their forward GEMMs).
        one_pass_s: :func:`pass_comm_s` when the caller has it (costed here when None).
    """
    one_pass = pass_comm_s(p, batch) if one_pass_s is None else one_pass_s
    moe = p.train.moe
    plain = 2 * one_pass
    shared = np.maximum(one_pass - shared_forward_s, 0.0) + np.maximum(one_pass - 2 * shared_forward_s, 0.0)
    plain = np.where(moe.shared_expert_overlap & ~batch.moe_ep_overlap, shared, plain)
    wgrad = expert_wgrad_s if moe.delay_wgrad else 0.0
    paired = np.maximum(one_pass - 2 * layer_forward_s, 0.0) + np.maximum(one_pass - layer_forward_s - wgrad, 0.0)
    unpaired = np.minimum(1.0, batch.pp / np.maximum(batch.num_microbatches, 1))
    overlapped = unpaired * 2 * one_pass + (1 - unpaired) * paired
    return np.where(batch.moe_ep_overlap, overlapped, plain)


def expert_compute_s(p: Problem, batch: LayoutBatch, mlp_gemm_s: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(shared experts' forward GEMM seconds, routed experts' forward grouped-GEMM seconds) of one
    MoE layer and micro-batch: what shared-expert overlap and delayed weight gradients can hide
    communication under (the routed experts' weight gradients are about their forward GEMMs).
    ``mlp_gemm_s``: the seconds of each GEMM of the MoE MLP block when the caller has them
    (:attr:`autopar.cost.compute.LayerTimes.mlp_gemm_s`); costed here when None."""
    from autopar.cost.compute import gemm_time_s

    gemms = F.mlp_gemms(p, batch, True)
    each = [gemm_time_s(p, g) for g in gemms] if mlp_gemm_s is None else mlp_gemm_s
    routed = sum(t for g, t in zip(gemms, each) if g.expert)
    shared = sum((t for g, t in zip(gemms[3:], each[3:]) if not g.expert), np.zeros(len(batch)))
    return shared, routed
