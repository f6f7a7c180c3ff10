"""Op orders of the V-shape and bidirectional zero-bubble schedules (two chunks per rank).

Ops are ``(kind, microbatch, chunk)`` with ``chunk`` the rank's local chunk (its virtual stage
comes from :func:`autopar.pipeline.placement.placement`). Kinds: ``F`` forward, ``B`` full
backward (input and weight gradients), ``I`` input-gradient backward whose weight gradient runs
later as its own ``W`` op (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, sec. 2),
and ``O``, a forward overlapped with the backward that follows it in the order (DualPipe's
``F&B``: both start once both inputs have arrived).

* ZB-V (:func:`zbv_order`): PyTorch ``ScheduleZBVZeroBubble._calculate_single_rank_operations``
  (``torch/distributed/pipelining/schedules.py``, what torchtitan runs for
  ``pipeline_parallel_schedule = "ZBVZeroBubble"``): warm-up ``2 (pp - r) - 1`` chunk-0
  forwards, ``r`` pairs of chunk-1 and chunk-0 forwards, ``pp - r`` rounds of chunk-1
  ``F, I, W``; steady rounds ``F0 I0 W0 F1 I1 W1``; cool-down with the W passes last.
* DualPipeV (:func:`dualpipev_order`): github.com/deepseek-ai/DualPipe ``dualpipev.py``
  ``DualPipeV.step`` and PyTorch ``ScheduleDualPipeV`` (torchtitan ``"DualPipeV"``), its eight
  steps: ``F0``; ``F0 F1``; ``I1 W F1``; ``F0&B1 F1&B0`` (the last rank runs its first pair
  unoverlapped); ``B1 F1&B0``; ``B1 B0`` (the second half with split W); ``W B0``; ``W``.
* DualPipe (:func:`dualpipe_order`): ``dualpipe.py`` ``DualPipe.step``: the same eight steps
  with ``num_ranks = pp / 2``, rank ``min(r, pp - 1 - r)`` and ``m / 2`` micro-batches per
  direction (the V order is DualPipe cut in half; the repository README).
"""

from __future__ import annotations

Order = list[tuple[str, int, int]]


def zbv_order(rank: int, pp: int, num_microbatches: int) -> Order:
    """ZB-V's op order on ``rank`` (see the module docstring); any ``num_microbatches >= 1``
    (PyTorch plans ``max(2 pp - 1, m)`` micro-batches and drops the ops beyond ``m``)."""
    n_micro = max(2 * pp - 1, num_microbatches)
    ops: Order = []
    count = {("F", 0): 0, ("F", 1): 0, ("I", 0): 0, ("I", 1): 0, ("W", 0): 0, ("W", 1): 0}

    def add(pattern: str, times: int = 1) -> None:
        """Append ``pattern`` (ops as ``F0``: kind and chunk) ``times`` times."""
        for _ in range(times):
            for token in pattern.split():
                kind, chunk = token[0], int(token[1])
                ops.append((kind, count[kind, chunk], chunk))
                count[kind, chunk] += 1

    add("F0", 2 * (pp - rank) - 1)  # warm-up
    add("F1 F0", rank)
    add("F1 I1 W1", pp - rank)
    while count["F", 1] < count["F", 0] or count["F", 0] < n_micro:  # steady
        if count["F", 0] < n_micro:
            add("F0")
        add("I0 W0 F1 I1 W1")
    add("I0 I1", rank)  # cool-down
    add("I0 W0", pp - rank)
    add("W1", count["I", 1] - count["W", 1])
    add("W0", count["I", 0] - count["W", 0])
    return [op for op in ops if op[1] < num_microbatches]


def dualpipev_order(rank: int, num_ranks: int, num_microbatches: int) -> Order:
    """DualPipeV's op order on ``rank`` of ``num_ranks`` (see the module docstring); needs
    ``num_microbatches >= 2 * num_ranks`` (checked by the caller)."""
    ops: Order = []
    count: dict[tuple[str, int], int] = {}
    weights: list[tuple[int, int]] = []  # deferred W passes, FIFO (DualPipe's WeightGradStore)

    def add(kind: str, chunk: int) -> None:
        key = ("F" if kind in ("F", "O") else "B", chunk)
        mb = count.get(key, 0)
        count[key] = mb + 1
        ops.append((kind, mb, chunk))
        if kind == "I":
            weights.append((mb, chunk))

    def weight() -> None:
        if weights:
            mb, chunk = weights.pop(0)
            ops.append(("W", mb, chunk))

    for _ in range(2 * (num_ranks - rank - 1)):  # step 1: F0
        add("F", 0)
    for _ in range(rank + 1):  # step 2: F0 F1
        add("F", 0)
        add("F", 1)
    for _ in range(num_ranks - rank - 1):  # step 3: I1 W F1
        add("I", 1)
        weight()
        add("F", 1)
    for i in range(num_microbatches - 2 * num_ranks + rank + 1):  # step 4: F0&B1 F1&B0
        add("F" if i == 0 and rank == num_ranks - 1 else "O", 0)  # the middle rank's first pair is not overlapped
        add("B", 1)
        add("O", 1)
        add("B", 0)
    for _ in range(num_ranks - rank - 1):  # step 5: B1 F1&B0
        add("B", 1)
        add("O", 1)
        add("B", 0)
    split = False
    for i in range(rank + 1):  # step 6: B1 B0, the second half with split W
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        add("I" if split else "B", 1)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        add("I" if split else "B", 0)
    for _ in range(num_ranks - rank - 1):  # step 7: W B0
        weight()
        add("I", 0)
    for _ in range(rank + 1):  # step 8: W
        weight()
    return ops


def dualpipe_order(rank: int, pp: int, num_microbatches: int) -> Order:
    """DualPipe's op order on ``rank`` (see the module docstring); ``pp`` and
    ``num_microbatches`` even, ``num_microbatches >= 2 * pp`` (checked by the caller). Micro-batch
    indices count within each direction (``0 .. m/2 - 1``)."""
    return dualpipev_order(min(rank, pp - 1 - rank), pp // 2, num_microbatches // 2)
