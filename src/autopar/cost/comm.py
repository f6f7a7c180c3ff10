"""Collective times on the cluster topology (alpha-beta model, ring algorithms).

Ring collectives over ``g`` ranks moving a tensor of ``S`` bytes (Thakur et al., "Optimization
of Collective Communication Operations in MPICH", IJHPCA 2005; NCCL's bus-bandwidth
convention in nccl-tests ``PERFORMANCE.md``):

* all-reduce: ``2*(g-1)/g * S / busbw + 2*(g-1)*alpha``
* all-gather / reduce-scatter: ``(g-1)/g * S / busbw + (g-1)*alpha`` (S = the full tensor)
* all-to-all: ``(g-1)/g * S / busbw + (g-1)*alpha`` (S = what one rank sends in total)
* send/recv: ``S / bw + alpha``

Placement follows Megatron's rank order ``tp-cp-dp-pp`` (tp innermost): a group of ``g``
ranks with stride ``k`` between members stays inside a fast domain (a node, or an NVL72 rack)
when ``g*k <= domain``; otherwise it crosses the network, where each of its ``m`` members per
node drives its own NIC, so the ring's bus bandwidth is ``min(intra, m * nic)``.

Link parameters (intra bus bandwidth and latency, per-rank NIC bandwidth, inter-node latency)
come from the device spec, or from measured fits per collective while
:func:`use_link_fits` has installed them (``autopar.profile.linkfit.LinkFits``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any

import numpy as np

from autopar.cost.hooks import installed
from autopar.problem import Problem

_LINK_FITS: ContextVar[Any] = ContextVar("autopar_link_fits", default=None)


def use_link_fits(fits: Any) -> AbstractContextManager[None]:
    """Cost collectives with ``fits.link_params`` inside the ``with`` block."""
    return installed(_LINK_FITS, fits)


def link_params(p: Problem, collective: str) -> tuple[float, float, float, float]:
    """(intra bus bandwidth bytes/s, intra latency s, per-rank NIC bandwidth bytes/s, inter
    latency s) of ``collective``: the device's fields times their efficiencies, or the measured
    fit where one is installed."""
    dev = p.cluster.device
    spec = (dev.intra_node_bandwidth_bytes_per_s * dev.intra_node_comm_efficiency, dev.intra_node_latency_s,
            dev.inter_node_bandwidth_bytes_per_s * dev.inter_node_comm_efficiency, dev.inter_node_latency_s)
    fits = _LINK_FITS.get()
    return spec if fits is None else fits.link_params(collective, spec)


def group_bus_bandwidth(p: Problem, size: np.ndarray, stride: np.ndarray,
                        collective: str = "all_reduce") -> tuple[np.ndarray, np.ndarray]:
    """(achievable bus bandwidth in bytes/s, per-step latency in s) of a rank group.

    Args:
        size: ranks in the group; stride: rank distance between consecutive members;
        collective: whose measured link fit applies (:func:`link_params`).
    """
    domain = p.cluster.fast_domain_size
    intra, intra_latency, nic, inter_latency = link_params(p, collective)
    size, stride = np.asarray(size, dtype=np.float64), np.asarray(stride, dtype=np.float64)
    inside = size * stride <= domain
    members_per_node = np.clip(np.floor(domain / stride), 1, size)
    bw = np.where(inside, intra, np.minimum(intra, members_per_node * nic))
    latency = np.where(inside, intra_latency, inter_latency)
    return bw, latency


def all_reduce_s(p: Problem, num_bytes, size, stride) -> np.ndarray:
    """Ring all-reduce of ``num_bytes`` over the group; 0 for groups of one."""
    bw, alpha = group_bus_bandwidth(p, size, stride)
    g = np.asarray(size, dtype=np.float64)
    return np.where(g > 1, 2 * (g - 1) / g * num_bytes / bw + 2 * (g - 1) * alpha, 0.0)


def all_gather_s(p: Problem, num_bytes, size, stride) -> np.ndarray:
    """Ring all-gather (or reduce-scatter) whose full tensor is ``num_bytes``."""
    bw, alpha = group_bus_bandwidth(p, size, stride, "all_gather")
    g = np.asarray(size, dtype=np.float64)
    return np.where(g > 1, (g - 1) / g * num_bytes / bw + (g - 1) * alpha, 0.0)


reduce_scatter_s = all_gather_s


def all_to_all_s(p: Problem, num_bytes, size, stride) -> np.ndarray:
    """All-to-all where each rank sends ``num_bytes`` in total, ``1/g`` to each member (one share
    stays local). Not a ring: each rank sends its ``(m-1)/g`` share to the ``m`` members of its
    fast domain over NVLink and the ``(g-m)/g`` share to other nodes over its own NIC, at the same
    time, so ``max(intra, inter)`` (NCCL ``alltoall`` is one grouped send/recv per peer; see also
    DeepSeek-V3 report sec. 3.2.2 on IB- vs NVLink-bound dispatch). Latency: one step per
    doubling of the group (peers are posted concurrently)."""
    domain = p.cluster.fast_domain_size
    g = np.asarray(size, dtype=np.float64)
    stride = np.asarray(stride, dtype=np.float64)
    inside = g * stride <= domain
    local = np.where(inside, g, np.clip(np.floor(domain / stride), 1, g))
    intra, intra_latency, nic, inter_latency = link_params(p, "all_to_all")
    share = np.asarray(num_bytes, dtype=np.float64) / g
    wire = np.maximum((local - 1) * share / intra, (g - local) * share / nic)
    alpha = np.where(inside, intra_latency, inter_latency)
    return np.where(g > 1, wire + np.log2(np.maximum(g, 1)) * alpha, 0.0)


def send_recv_s(p: Problem, num_bytes, size, stride) -> np.ndarray:
    """One point-to-point transfer between neighbours of a group of ``size`` with ``stride``:
    over NVLink when the whole group sits in a fast domain, else over one NIC."""
    inside = np.asarray(size) * np.asarray(stride) <= p.cluster.fast_domain_size
    intra, intra_latency, nic, inter_latency = link_params(p, "send_recv")
    bw = np.where(inside, intra, nic)
    alpha = np.where(inside, intra_latency, inter_latency)
    return np.where(np.asarray(size) > 1, num_bytes / bw + alpha, 0.0)
