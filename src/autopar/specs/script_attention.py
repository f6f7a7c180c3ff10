"""A launch script's attention-pattern flags: sliding-window layers and attention sinks; and the
dropout switch and rates (:func:`dropout_fields`, :func:`dropout_args`).

Megatron-LM ``megatron/training/arguments.py`` (core_v0.15.0) and
``megatron/core/transformer/utils.py`` ``is_layer_window_attention``:

* ``--window-size L,R``: window attention of ``L`` keys back (``R`` ahead: 0 for causal
  models; GPT-OSS ``128,0`` in Megatron-Bridge's provider); absent = no window.
* ``--window-attn-skip-freq``: which layers use the window: an integer N puts one full layer
  after N-1 window layers (layer number ``j = i + 1`` is a window layer when ``j % N != 0``),
  a list expression (``"[1,0]*18"``) marks them one by one (1 = window). Absent: every layer.
* ``--softmax-type vanilla|off-by-one|learnable``: ``learnable`` is GPT-OSS's learned per-head
  sink logit (parameters); ``off-by-one`` adds a constant 1 and has none.
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args

SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")


def attention_fields(a: Args, num_layers: int) -> dict[str, Any]:
    """ModelSpec fields ``sliding_window``, ``window_layers``, ``attention_sinks`` (module docstring).

    Raises:
        AutoparError: a window size that is not ``L,R`` with ``R`` 0, a skip frequency below 1,
            a pattern whose length is not ``--num-layers`` or whose entries are not 0/1, a skip
            frequency without a window, or an unknown softmax type.
    """
    fields: dict[str, Any] = {}
    softmax = a.text("--softmax-type", "vanilla")
    if softmax not in SOFTMAX_TYPES:
        raise AutoparError(f"{a.source}: --softmax-type={softmax!r}: allowed {', '.join(SOFTMAX_TYPES)}")
    if softmax == "learnable":
        fields["attention_sinks"] = True
    text = a.text("--window-size")
    if text is None:
        if a.has("--window-attn-skip-freq"):
            raise AutoparError(f"{a.source}: --window-attn-skip-freq without --window-size: Megatron-LM then uses "
                               "no window attention; add --window-size or drop it")
        return fields
    parts = [p.strip() for p in text.strip("()").split(",")]
    if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts) or int(parts[0]) < 1 or int(parts[1]) != 0:
        raise AutoparError(f"{a.source}: --window-size={text!r}: expected LEFT,0 with LEFT >= 1 keys (causal "
                           "sliding window, e.g. 128,0)")
    freq = a.text("--window-attn-skip-freq")
    if freq is None:
        pattern = [1] * num_layers
    else:
        pattern = a.frequency("--window-attn-skip-freq", freq, "[1,0]*18")
        if isinstance(pattern, int):
            pattern = [1 if (i + 1) % pattern else 0 for i in range(num_layers)]
        if len(pattern) != num_layers or any(f not in (0, 1) or isinstance(f, bool) for f in pattern):
            raise AutoparError(f"{a.source}: --window-attn-skip-freq={freq!r}: needs {num_layers} entries of 0 "
                               "(full) or 1 (window), one per --num-layers")
    fields.update(sliding_window=int(parts[0]), window_layers=tuple(i for i, w in enumerate(pattern) if w))
    return fields


def attention_args(m) -> list[str]:
    """The Megatron-LM flags of a :class:`~autopar.specs.model.ModelSpec`'s window layers and
    sinks, as :func:`attention_fields` reads them back (``m``: the model spec)."""
    args = []
    if m.window_layers:
        window = set(m.window_layers)
        pattern = ",".join("1" if i in window else "0" for i in range(m.num_layers))
        args.append(f'--window-size {m.sliding_window},0 --window-attn-skip-freq "[{pattern}]"')
    if m.attention_sinks:
        args.append("--softmax-type learnable")
    return args


def dropout_args(m) -> str:
    """``--attention-dropout`` and ``--hidden-dropout`` of a :class:`~autopar.specs.model.ModelSpec`
    ``m``, both always written as costed: ``ModelSpec.dropout`` is both masks
    (:func:`dropout_fields`), at the script's own rates (``ModelSpec.dropout_rates``), else at
    Megatron-LM's default 0.1 each (``_add_regularization_args``; the rate changes no cost), and
    0.0 each without dropout. Writing only one would let Megatron run the other at its default 0.1."""
    attention, hidden = dropout_rates(m)
    return f"--attention-dropout {float(attention)} --hidden-dropout {float(hidden)}"


def dropout_rates(m) -> tuple[float, float]:
    """(attention, hidden) dropout probabilities an export writes for ``m``: the script's
    (``ModelSpec.dropout_rates``), else Megatron-LM's default 0.1 each with ``ModelSpec.dropout``,
    else 0.0 each."""
    if not m.dropout:
        return 0.0, 0.0
    return m.dropout_rates or (0.1, 0.1)


def dropout_fields(a: Args) -> dict[str, object]:
    """``ModelSpec.dropout`` and ``dropout_rates`` of a script: ``--attention-dropout`` and
    ``--hidden-dropout`` (Megatron-LM defaults 0.1 each, ``_add_regularization_args``) both > 0, or
    both 0. The rates are kept (for the exports to write back) where the script gives either flag.

    ``ModelSpec.dropout`` is one switch for the attention-probability dropout and the hidden (residual,
    embedding) dropout masks together (:mod:`autopar.cost.dropout`, :mod:`autopar.cost.activations`);
    the rate itself changes no cost.

    Raises:
        AutoparError: one of them 0 and the other > 0 (autopar would cost both masks, or neither), or
            a rate outside [0, 1) (:meth:`~autopar.specs.script_launch.Args.probability`).
    """
    attention, hidden = a.probability("--attention-dropout", 0.1), a.probability("--hidden-dropout", 0.1)
    given = lambda flag: "" if a.has(flag) else " (Megatron-LM's default)"  # noqa: E731
    if (attention > 0) != (hidden > 0):
        raise AutoparError(f"{a.source}: --attention-dropout={attention:g}{given('--attention-dropout')} with "
                           f"--hidden-dropout={hidden:g}{given('--hidden-dropout')}: autopar costs dropout as one "
                           "switch (the attention and the hidden dropout masks together), so one of them 0 and the "
                           "other not is not modelled; give both > 0 or both 0")
    on = attention > 0
    stated = on and (a.has("--attention-dropout") or a.has("--hidden-dropout"))
    return {"dropout": on, "dropout_rates": (attention, hidden) if stated else None}
