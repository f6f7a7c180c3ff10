"""Collective sweeps under ``torchrun`` and their latency-bandwidth fit (torch.distributed).

Every rank runs all-reduce, all-gather, reduce-scatter, all-to-all and send/recv over the
message sizes, for each group size ``g`` (powers of two up to the world, ranks ``0..g-1``);
the time of a sample is the slowest rank's median; send/recv goes from rank 0 to rank ``g-1``.
A group within ``LOCAL_WORLD_SIZE`` ranks is link class ``intra`` (NVLink, or shared memory on
CPU), else ``inter`` (the network, with ``LOCAL_WORLD_SIZE`` ranks per node).

The fit uses the model of :mod:`autopar.cost.comm`, so its numbers plug straight into the
device fields: ``t = steps * alpha + volume / busbw`` with ``steps = 2(g-1)`` and
``volume = 2(g-1)/g * S`` for all-reduce, ``g-1`` and ``(g-1)/g * S`` for all-gather and
reduce-scatter (``S`` the full tensor), ``log2(g)`` and ``(g-1)/g * S`` for all-to-all (peers
posted concurrently, as :func:`autopar.cost.comm.all_to_all_s`), ``1`` and ``S`` for
send/recv. Least squares (numpy) over all samples of a (collective, link) gives ``alpha`` (s
per step) and the bus bandwidth (bytes/s); :mod:`autopar.profile.linkfit` feeds them to the
planner.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def ring_terms(collective: str, g: int, size: float) -> tuple[float, float]:
    """(latency steps, bus volume in bytes) of one collective of ``size`` bytes over ``g``."""
    if collective == "all_reduce":
        return 2 * (g - 1), 2 * (g - 1) / g * size
    if collective == "send_recv":
        return 1, size
    if collective == "all_to_all":
        return float(np.log2(g)), (g - 1) / g * size
    return g - 1, (g - 1) / g * size


def fit(samples: list[tuple[int, float, float]], collective: str) -> tuple[float, float]:
    """(alpha s/step, bus bandwidth bytes/s) from (group size, bytes, seconds) samples.

    Raises:
        ValueError: fewer than two samples, or a non-positive fitted bandwidth.
    """
    if len(samples) < 2:
        raise ValueError(f"{collective}: {len(samples)} sample(s); need at least 2 to fit")
    design = np.array([ring_terms(collective, g, s) for g, s, _ in samples], dtype=np.float64)
    times = np.array([t for _, _, t in samples], dtype=np.float64)
    (alpha, inv_bw), *_ = np.linalg.lstsq(design, times, rcond=None)
    if inv_bw <= 0:
        raise ValueError(f"{collective}: fitted bandwidth is not positive (latency-bound samples only)")
    return max(float(alpha), 0.0), float(1 / inv_bw)


def sweep(sizes: list[int], repeats: int = 5) -> list[tuple[str, str, int, int, float]]:
    """Run every collective on every group and size; returns (collective, link, g, bytes,
    seconds) on rank 0 and [] elsewhere. The process group must be initialised."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    out = []
    g = 2
    while g <= world:
        group = dist.new_group(list(range(g)))
        link = "intra" if g <= local else "inter"
        for size in sizes:
            for name in COLLECTIVES:
                elapsed = _time_one(name, size, g, group, rank, device, repeats) if rank < g else 0.0
                slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                if rank == 0:
                    out.append((name, link, g, size, float(slowest.item())))
        g *= 2
    return out


def _time_one(name: str, size: int, g: int, group, rank: int, device: str, repeats: int) -> float:
    import torch
    import torch.distributed as dist

    numel = max(g, size // 4 // g * g)  # fp32 elements, divisible by g
    full = torch.ones(numel, dtype=torch.float32, device=device)
    shard = torch.empty(numel // g, dtype=torch.float32, device=device)
    ops = {
        "all_reduce": lambda: dist.all_reduce(full, group=group),
        "all_gather": lambda: dist.all_gather_into_tensor(full, shard, group=group),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full, group=group),
        "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(full), full, group=group),
        "send_recv": lambda: _send_recv(full, rank, g),
    }
    if name == "reduce_scatter" and dist.get_backend() == "gloo":
        ops[name] = lambda: dist.all_reduce(full, group=group)  # gloo lacks reduce_scatter: same ring volume x2
    times = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        start = time.perf_counter()
        ops[name]()
        if device != "cpu":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    if name == "reduce_scatter" and dist.get_backend() == "gloo":
        return statistics.median(times) / 2
    return statistics.median(times)


def _send_recv(buf, rank: int, g: int) -> None:
    """Rank 0 sends to the group's last rank ``g-1`` (on another node when the link is inter)."""
    import torch.distributed as dist

    if rank == 0:
        dist.send(buf, g - 1)
    elif rank == g - 1:
        dist.recv(buf, 0)
