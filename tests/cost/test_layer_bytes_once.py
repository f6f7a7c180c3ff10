"""Each layer's activation bytes costed once per call (autopar.cost.memory.layer_bytes,
autopar.cost.activations.attention_bytes_kept_full / mlp_bytes_kept_full, the MTP block reusing
them): every value is bit-identical to the separate calls it replaces, on layouts drawn from real
search spaces (dense, MoE, MLA + MTP, torchtitan's per-op SAC, fp8 with bf16 first/last layers)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from conftest import make_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost import activations as act
from autopar.cost import framework_memory as fw_mem
from autopar.cost import mtp
from autopar.cost.memory import layer_bytes
from autopar.search.grid import for_search
from autopar.search.valid_space import valid_layouts

SPACES = [  # (model, nodes, gbs, seq, target, train options)
    ("llama3-8b", 2, 256, 8192, "megatron", {}),
    ("qwen3-30b-a3b", 1, 64, 4096, "megatron", {}),
    ("deepseek-v3", 4, 1024, 4096, "megatron", {}),
    ("llama3-8b", 2, 256, 8192, "torchtitan", {}),
    ("llama3-8b", 1, 64, 4096, "megatron", {"precision": "fp8"}),
]


@lru_cache(maxsize=None)
def _space(i: int):
    model, nodes, gbs, seq, target, train = SPACES[i]
    p, options = for_search(make_problem(model, nodes=nodes, gbs=gbs, seq=seq, **train), target, None)
    return p, valid_layouts(p, options, []).valid


@settings(max_examples=30, deadline=None)
@given(st.integers(0, len(SPACES) - 1), st.lists(st.integers(0, 2**31), min_size=1, max_size=60))
def test_kept_and_full_bytes_equal_the_separate_calls_bit_for_bit(space, picks):
    p, valid = _space(space)
    batch = valid.take(np.asarray(picks) % len(valid))
    selective, none = batch.recompute == 1, np.zeros(len(batch), dtype=bool)
    kept, full = act.attention_bytes_kept_full(p, batch, selective)
    assert np.array_equal(kept, act.attention_bytes(p, batch, selective))
    assert np.array_equal(full, act.attention_bytes(p, batch, none))
    for moe in (False, True) if p.model.is_moe else (False,):
        kept, full = act.mlp_bytes_kept_full(p, batch, moe, selective)
        assert np.array_equal(kept, act.mlp_bytes(p, batch, moe, selective))
        assert np.array_equal(full, act.mlp_bytes(p, batch, moe))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, len(SPACES) - 1), st.lists(st.integers(0, 2**31), min_size=1, max_size=60))
def test_layer_bytes_are_the_attention_plus_mlp_sums_they_replace(space, picks):
    """The sums memory.py and mtp.py formed from separate calls before: a dense layer (per-op SAC
    under torchtitan), a MoE layer, the no-recompute layers of full recompute's working set, and
    the MTP block's activations."""
    p, valid = _space(space)
    batch = valid.take(np.asarray(picks) % len(valid))
    selective, none = batch.recompute == 1, np.zeros(len(batch), dtype=bool)
    got = layer_bytes(p, batch)
    attn, attn_full = act.attention_bytes(p, batch, selective), act.attention_bytes(p, batch, none)
    dense = attn + act.mlp_bytes(p, batch, moe=False, selective=selective)
    assert np.array_equal(got.dense_megatron, dense)
    if fw_mem.op_sac(p):
        dense = np.where(selective, fw_mem.op_sac_layer_bytes(p, batch), dense)
    assert np.array_equal(got.dense, dense)
    moe = attn + act.mlp_bytes(p, batch, moe=True, selective=selective) if p.model.is_moe else dense
    assert np.array_equal(got.moe, moe)
    assert np.array_equal(got.attention_full, attn_full)
    assert np.array_equal(got.dense_full, attn_full + act.mlp_bytes(p, batch, moe=False))
    assert np.array_equal(got.moe_full, attn_full + act.mlp_bytes(p, batch, moe=p.model.is_moe))
    assert np.array_equal(mtp.activation_bytes(p, batch, got), mtp.activation_bytes(p, batch))


def test_mtp_activations_are_costed_for_deepseek_v3():
    """The reuse path is exercised: DeepSeek-V3 has one MTP layer, so its activations are > 0."""
    p, valid = _space(2)
    batch = valid.take(np.arange(20))
    assert p.model.mtp_num_layers == 1
    assert np.all(mtp.activation_bytes(p, batch, layer_bytes(p, batch)) > 0)
