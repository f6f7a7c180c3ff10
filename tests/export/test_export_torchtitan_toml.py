"""The torchtitan export says it is sections to merge into the user's TOML."""

from __future__ import annotations

from autopar.strategy import Strategy
from conftest import make_problem


def test_torchtitan_toml_says_it_is_sections_to_merge():
    """torchtitan takes the model from ``[model] name/flavor`` (else its debug model), which the
    export does not write: the file must say so, and still parse to the same sections."""
    import tomllib

    from autopar.export import torchtitan

    p = make_problem("llama3-8b", gbs=64, seq=4096)
    text = torchtitan.write(p, Strategy(dp=8, zero=3))
    head = text.splitlines()[:3]
    assert all(line.startswith("# ") for line in head) and "llama3-8b" in head[0] and "[model]" in head[1]
    assert tomllib.loads(text) == torchtitan.config(p, Strategy(dp=8, zero=3))
    # [model] converters and [compile] override what the model's own train config turns on
    assert set(tomllib.loads(text)) == {"training", "parallelism", "activation_checkpoint", "model", "compile"}
