"""Time of the routed experts' grouped GEMM: narrow experts at few rows run below dense GEMM speed.

A grouped GEMM (Transformer Engine ``GroupedLinear``, CUTLASS/DeepGEMM grouped kernels) computes
``E_local`` GEMMs of ``rows x k`` by ``k x n``, one per local expert. Two mechanisms make it slower
per FLOP than the large dense GEMMs the device's ``gemm_efficiency`` was fitted on:

* **Row tiles**: each expert's rows are padded to the M tile (:data:`TILE_ROWS`), so an expert with
  few tokens wastes tensor-core work (``ceil(rows / 128) * 128`` rows are computed).
* **Short reductions**: every output tile pays a fixed prologue and epilogue (TMA descriptor and
  pipeline fill, the fp32 accumulator's conversion and store) on top of its ``k``-long main loop,
  so the achieved rate is ``k / (k + K0)`` of the long-``k`` rate. DeepGEMM's published H800
  table (``deepseek-ai/DeepGEMM`` README, "Normal GEMMs for dense models", M = 4096, FP8) gives the
  curve: 590 TFLOP/s at k = 512, 990 at 1536, 1025 at 2048, 1304 at 7168 and 1358 at 16384, which
  ``0.72 * 1979 * k / (k + 717)`` reproduces within 3%: :data:`K_OVERHEAD` = 717. The same README's
  grouped tables (contiguous 8 x 4096 rows: 1288 / 1093 TFLOP/s at k = 7168 / 2048; masked 4 x 256
  rows: 932 / 815) show grouped kernels on that curve, and lower still at 256 rows per expert
  (where the weights' HBM read is the roofline's memory side).

The device efficiency is fitted on long reductions (hidden sizes 4096-16384, where ``k / (k + K0)``
is 0.85-0.96), so the factor applied here is the ratio to a reduction of :data:`K_REFERENCE`:
``(k + K0) / k * K_REF / (K_REF + K0)``, at least 1. Qwen3-30B-A3B's experts (2048 x 768) run their
fc2 (k = 768) at 0.55x the dense rate and fc1 (k = 2048) at 0.8x; GPT-OSS's (2880 x 2880) at 0.86x.
Backward GEMMs are costed as twice the forward (``compute.LayerTimes``), at the forward's shape.
"""

from __future__ import annotations

import numpy as np

TILE_ROWS = 128  # M tile of TE/cuBLAS and DeepGEMM grouped kernels (DeepGEMM BLOCK_M 128; contiguous-layout alignment)
K_OVERHEAD = 717.0  # per-tile fixed cost in reduction steps: fit of DeepGEMM's dense M=4096 table (module docstring)
K_REFERENCE = 8192.0  # the long reductions gemm_efficiency was fitted on (hidden sizes of the dense validation rows)


def padded_rows(rows: np.ndarray) -> np.ndarray:
    """Rows per expert padded to the M tile (:data:`TILE_ROWS`); 0 stays 0."""
    return np.ceil(np.asarray(rows, dtype=np.float64) / TILE_ROWS) * TILE_ROWS


def reduction_slowdown(k: np.ndarray) -> np.ndarray:
    """Time factor (>= 1) of a GEMM with reduction length ``k`` against one of :data:`K_REFERENCE`:
    ``(k + K0) / k * K_REF / (K_REF + K0)`` (module docstring)."""
    k = np.maximum(np.asarray(k, dtype=np.float64), 1.0)
    return np.maximum((k + K_OVERHEAD) / k * K_REFERENCE / (K_REFERENCE + K_OVERHEAD), 1.0)


def expert_gemm_flops_s(rows: np.ndarray, n: np.ndarray, k: np.ndarray, count: np.ndarray | float,
                        peak_flops_per_s: float | np.ndarray) -> np.ndarray:
    """Compute-side seconds of ``count`` expert GEMMs of ``rows x k`` by ``k x n`` at an achievable
    dense rate ``peak_flops_per_s`` (peak times the device's GEMM efficiency): tile-padded rows,
    slowed by :func:`reduction_slowdown`. The memory side (weights read once) is the caller's
    roofline."""
    tiled = 2.0 * padded_rows(rows) * n * k * count
    return tiled / peak_flops_per_s * reduction_slowdown(k)
