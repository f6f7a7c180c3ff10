"""MindSpeed-LLM launch flags that change memory or time but that autopar does not model: a script
with one of them is refused with the reason (one line), never read as if the flag were absent.

Sources: ``mindspeed/arguments.py`` (commit 028de58), flags of the ``memory`` argument group.
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args

# flag -> what it does and why autopar does not cost it.
REFUSED_MINDSPEED_FLAGS: dict[str, str] = {
    "--swap-attention": "swaps the attention modules' activations (--swap-modules) to host memory and prefetches "
                        "them back; autopar models neither the host copies nor their overlap",
    "--recompute-activation-function": "recomputes the MLP activation function outside Megatron's recompute "
                                       "granularity (with its own layer count); autopar's selective recompute "
                                       "follows Megatron's --recompute-modules",
    "--recompute-norm": "recomputes the norms outside Megatron's recompute granularity (with its own layer "
                        "count); use Megatron's --recompute-granularity selective --recompute-modules layernorm",
    "--recompute-in-bubble": "moves recompute into the pipeline bubble; autopar's schedule simulation has no such op",
    "--recompute-in-advance": "moves recompute ahead of the backward pass; not in autopar's schedule simulation",
    "--adaptive-memory-optimization": "chooses swap/recompute per module at run time; not predictable ahead",
}


def refuse_unmodelled(a: Args) -> None:
    """Refuse a script that passes a flag of :data:`REFUSED_MINDSPEED_FLAGS`.

    Raises:
        AutoparError: naming the first such flag and what it does.
    """
    for flag, why in REFUSED_MINDSPEED_FLAGS.items():
        if a.has(flag):
            raise AutoparError(f"{a.source}: {flag} is not modelled by autopar (it {why}); drop it to plan "
                               "without it")
