"""``ModelSpec``: the shape of a decoder-only transformer, and its parameter count.

Everything the cost model needs about the network lives here, read from a Hugging Face
``config.json`` (:mod:`autopar.specs.hf`) or a shipped preset. No field is defaulted from a
rule of thumb: the FFN width, head dimension, tying and MLP kind come from the config.

Parameter counts are split into *buckets* that shard differently (Megatron-Core layout):

* ``tp``: weights split over tensor parallelism (QKV/O, MLP, shared experts, column biases);
* ``replicated``: copied on every TP rank (norm weights, row-parallel biases, the router,
  MLA down-projections, which Megatron-Core builds as ``duplicated`` linears);
* ``experts``: routed-expert weights, split over ``ep * etp``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator


class LayerParams(NamedTuple):
    """Parameter counts of one decoder layer, by sharding bucket (unsharded element counts)."""

    tp: int
    replicated: int
    experts: int

    @property
    def total(self) -> int:
        return self.tp + self.replicated + self.experts


# Largest width/count a model field may hold: beyond 2^31 the int64 layout arithmetic of the rules
# and the padded vocabulary (vocab x tp x padding unit) overflows (a config with vocab_size 1e20 crashed).
MAX_SIZE = 2**31
# Most decoder layers a model may have (the per-layer tables and the balancer loop over them).
MAX_LAYERS = 10_000


class ModelSpec(BaseModel):
    """A decoder-only transformer, as the planner sees it.

    All sizes are element counts (not bytes). Validation raises pydantic's ``ValidationError``;
    loaders convert it to one :class:`~autopar.errors.AutoparError` line.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    num_layers: int = Field(gt=0, le=MAX_LAYERS, description="decoder layers (HF num_hidden_layers)")
    hidden_size: int = Field(gt=0, le=MAX_SIZE)
    num_attention_heads: int = Field(gt=0, le=MAX_SIZE)
    num_kv_heads: int = Field(gt=0, le=MAX_SIZE, description="key/value heads (GQA groups); = heads for MHA")
    head_dim: int = Field(gt=0, le=MAX_SIZE, description="per-head width of q/k/v (MHA/GQA)")
    ffn_hidden_size: int = Field(gt=0, le=MAX_SIZE, description="dense MLP intermediate width")
    vocab_size: int = Field(gt=0, le=MAX_SIZE)
    max_position_embeddings: int | None = Field(default=None, gt=0, le=MAX_SIZE)
    tie_word_embeddings: bool
    gated_mlp: bool = Field(description="SwiGLU/GeGLU (3 matrices) instead of a 2-matrix MLP")
    norm: Literal["rmsnorm", "layernorm"]
    norms_per_layer: int = Field(default=2, ge=1, description="4 for Gemma 2/3 (pre+post norms)")
    qkv_bias: bool = False
    linear_bias: bool = Field(default=False, description="every linear has a bias (GPT-2)")
    qk_norm: bool = False
    position_embedding: Literal["rope", "learned"] = "rope"
    rope_theta: float | None = Field(default=None, gt=0, le=1e15, description="RoPE base (HF rope_theta); "
                                     "None = the config does not say (Megatron's default is 10000)")
    norm_eps: float | None = Field(default=None, gt=0, lt=1, description="norm epsilon (HF rms_norm_eps / "
                                   "layer_norm_eps); None = the config does not say (Megatron's default 1e-5)")
    dropout: bool = Field(default=False, description="hidden/attention dropout > 0 (masks kept)")
    dropout_rates: tuple[float, float] | None = Field(
        default=None, description="(attention, hidden) dropout probabilities the launch script gives "
        "(--attention-dropout, --hidden-dropout), written back by the exports; None = not given (the exports "
        "write the frameworks' default 0.1 each); only with dropout, each in (0, 1); the rate changes no cost")
    sliding_window: int = Field(default=0, ge=0, le=MAX_SIZE, description="keys a sliding-window attention "
                                "layer sees (HF sliding_window; GPT-OSS 128); 0 = none")
    window_layers: tuple[int, ...] = Field(default=(), description="indices of the sliding-window layers (HF "
                                           "layer_types 'sliding_attention')")
    attention_sinks: bool = Field(default=False, description="learned per-head sink logit in the softmax "
                                  "(GPT-OSS; Megatron --softmax-type learnable): one parameter per head and layer")

    # Mixture of experts (0 experts = dense).
    num_experts: int = Field(default=0, ge=0, le=MAX_SIZE)
    num_experts_per_tok: int = Field(default=0, ge=0, le=MAX_SIZE)
    moe_ffn_hidden_size: int = Field(default=0, ge=0, le=MAX_SIZE, description="per routed expert")
    shared_expert_ffn_hidden_size: int = Field(default=0, ge=0, le=MAX_SIZE, description="all shared experts")
    moe_layers: tuple[int, ...] = Field(default=(), description="indices of MoE layers")
    router_bias: bool = Field(default=False, description="DeepSeek-V3 expert score bias")
    router_sigmoid: bool = Field(default=False, description="sigmoid router scores without an expert bias "
                                 "(Llama 4; Megatron --moe-router-score-function sigmoid)")
    router_num_groups: int = Field(default=0, ge=0, le=MAX_SIZE, description="group-limited routing: expert "
                                   "groups (HF n_group, Megatron --moe-router-num-groups); 0 = not group-limited")
    router_group_topk: int = Field(default=0, ge=0, le=MAX_SIZE, description="groups a token may route to (HF "
                                   "topk_group, Megatron --moe-router-group-topk)")
    router_aux_loss_coeff: float = Field(default=0.0, ge=0, le=1e3, description="load-balancing loss "
                                         "coefficient (HF router_aux_loss_coef, Megatron --moe-aux-loss-coeff); "
                                         "0 = no auxiliary loss")
    router_topk_scaling_factor: float | None = Field(default=None, gt=0, le=1e6, description="routed-expert weight "
                                                     "scale (HF routed_scaling_factor, Megatron "
                                                     "--moe-router-topk-scaling-factor); None = 1")

    # Multi-head latent attention (DeepSeek-V2/V3); q_lora_rank 0 = no q compression.
    mla: bool = False
    q_lora_rank: int = Field(default=0, ge=0, le=MAX_SIZE)
    kv_lora_rank: int = Field(default=0, ge=0, le=MAX_SIZE)
    qk_nope_head_dim: int = Field(default=0, ge=0, le=MAX_SIZE)
    qk_rope_head_dim: int = Field(default=0, ge=0, le=MAX_SIZE)
    v_head_dim: int = Field(default=0, ge=0, le=MAX_SIZE)
    mtp_num_layers: int = Field(default=0, ge=0, le=MAX_LAYERS, description="multi-token-prediction layers (DeepSeek-V3: 1)")

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> "ModelSpec":
        """Cross-field checks. Fields are named through ``info.context["names"]`` where the caller
        gives one (the HF reader passes its config keys: ``n_group`` for ``router_num_groups``), so
        the message names what the user wrote; otherwise by field name."""
        names = (info.context or {}).get("names", {})

        def n(field: str) -> str:
            return names.get(field, {"num_kv_heads": "num_key_value_heads"}.get(field, field))

        if self.dropout_rates is not None and not (self.dropout and all(0 < r < 1 for r in self.dropout_rates)):
            raise ValueError(f"{n('dropout_rates')}={self.dropout_rates}: two probabilities in (0, 1), "
                             "given only with dropout on")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"{n('num_attention_heads')}={self.num_attention_heads} is not a multiple of "
                f"{n('num_kv_heads')}={self.num_kv_heads}"
            )
        if self.num_experts:
            if not 0 < self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"{n('num_experts_per_tok')}={self.num_experts_per_tok} must be in 1..{self.num_experts} "
                    f"({n('num_experts')})"
                )
            if self.moe_ffn_hidden_size <= 0:
                raise ValueError(f"{n('moe_ffn_hidden_size')}={self.moe_ffn_hidden_size} must be > 0 for a MoE model")
            bad = [i for i in self.moe_layers if not 0 <= i < self.num_layers]
            if bad:
                raise ValueError(f"moe_layers {bad} outside 0..{self.num_layers - 1}")
        elif self.moe_layers:
            raise ValueError(f"moe_layers given but {n('num_experts')} is 0")
        if self.router_num_groups:  # Megatron-Core moe_utils.group_limited_topk: equal groups, enough experts
            groups, picked = self.router_num_groups, self.router_group_topk
            if not self.num_experts or self.num_experts % groups or not 0 < picked <= groups \
                    or self.num_experts_per_tok > picked * (self.num_experts // groups):
                raise ValueError(f"{n('router_num_groups')}={groups} with {n('router_group_topk')}={picked}: the "
                                 f"groups must split {n('num_experts')}={self.num_experts} evenly and the top {picked} "
                                 f"groups hold at least {n('num_experts_per_tok')}={self.num_experts_per_tok} experts")
        bad = [i for i in self.window_layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"window_layers {bad} outside 0..{self.num_layers - 1}")
        if self.window_layers and not self.sliding_window:
            raise ValueError(f"sliding-window layers given but {n('sliding_window')} is 0")
        if self.mla and not (self.kv_lora_rank and self.qk_nope_head_dim and self.v_head_dim):
            raise ValueError(f"MLA needs {n('kv_lora_rank')}, {n('qk_nope_head_dim')} and {n('v_head_dim')} > 0")
        if self.mtp_num_layers > self.num_layers:  # each MTP module is one more decoder layer (1e9 was costed)
            raise ValueError(f"{n('mtp_num_layers')}={self.mtp_num_layers} must be at most "
                             f"{n('num_layers')}={self.num_layers} (DeepSeek-V3 uses 1)")
        return self

    # ----- derived widths -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_width(self) -> int:
        """Width of the query projection output (heads x per-head q/k dim)."""
        if self.mla:
            return self.num_attention_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of the key (= value) projection output of MHA/GQA."""
        return self.num_kv_heads * self.head_dim

    @property
    def v_width(self) -> int:
        """Width of the attention output before the output projection."""
        if self.mla:
            return self.num_attention_heads * self.v_head_dim
        return self.num_attention_heads * self.head_dim

    @property
    def attention_head_dim(self) -> int:
        """q.k dot-product width per head (for attention FLOPs)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.mla else self.head_dim

    @property
    def norm_params(self) -> int:
        """Parameters of one norm over the hidden size (LayerNorm has weight and bias)."""
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    @cached_property
    def _moe_layer_set(self) -> frozenset[int]:
        return frozenset(self.moe_layers)

    def is_moe_layer(self, index: int) -> bool:
        return index in self._moe_layer_set

    @property
    def window_layer_share(self) -> float:
        """Fraction of the decoder layers with sliding-window attention (GPT-OSS: 0.5)."""
        return len(set(self.window_layers)) / self.num_layers

    # ----- parameter counts -----------------------------------------------------------------
    def attention_params(self) -> LayerParams:
        """Attention block of one layer, including its input norm.

        MHA/GQA: Q (h x q), K and V (h x kv each), O (q x h). MLA (DeepSeek-V3 report, sec. 2.1.1):
        q_down (h x q_lora) + q norm + q_up (q_lora x heads*(nope+rope)), kv_down
        (h x (kv_lora + rope)) + kv norm + kv_up (kv_lora x heads*(nope+v)), O (heads*v x h).
        """
        h = self.hidden_size
        replicated = self.norm_params
        if self.mla:
            heads = self.num_attention_heads
            if self.q_lora_rank:
                replicated += h * self.q_lora_rank + self.q_lora_rank
                tp = self.q_lora_rank * self.q_width
            else:
                tp = h * self.q_width
            replicated += h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            tp += self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            tp += self.v_width * h
            return LayerParams(tp=tp, replicated=replicated, experts=0)
        tp = h * (self.q_width + 2 * self.kv_width) + self.v_width * h
        if self.qkv_bias or self.linear_bias:
            tp += self.q_width + 2 * self.kv_width  # column-parallel bias: split with TP
        if self.linear_bias:
            replicated += h  # row-parallel output bias: replicated
        if self.qk_norm:
            replicated += 2 * self.head_dim
        if self.norms_per_layer > 2:
            replicated += (self.norms_per_layer - 2) // 2 * self.norm_params
        if self.attention_sinks:
            tp += self.num_attention_heads  # one sink logit per head (GPT-OSS ``sinks``), split with the heads
        return LayerParams(tp=tp, replicated=replicated, experts=0)

    def _mlp_matrix_params(self, ffn: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * ffn

    def mlp_params(self, layer_index: int) -> LayerParams:
        """MLP block of one layer, including its pre-MLP norm (and Gemma's extra norms)."""
        h = self.hidden_size
        replicated = self.norm_params
        if self.norms_per_layer > 2:
            replicated += (self.norms_per_layer - 2 + 1) // 2 * self.norm_params
        if not self.is_moe_layer(layer_index):
            tp = self._mlp_matrix_params(self.ffn_hidden_size)
            if self.linear_bias:
                tp += self.ffn_hidden_size * (2 if self.gated_mlp else 1)
                replicated += h
            return LayerParams(tp=tp, replicated=replicated, experts=0)
        experts = self.num_experts * self._mlp_matrix_params(self.moe_ffn_hidden_size)
        tp = self._mlp_matrix_params(self.shared_expert_ffn_hidden_size)
        replicated += h * self.num_experts + (self.num_experts if self.router_bias else 0)
        if self.linear_bias:  # GPT-OSS: biased experts (fc1 2f or f, fc2 h each) and router (E)
            experts += self.num_experts * (self.moe_ffn_hidden_size * (2 if self.gated_mlp else 1) + h)
            replicated += self.num_experts
        return LayerParams(tp=tp, replicated=replicated, experts=experts)

    def layer_params(self, layer_index: int) -> LayerParams:
        """All parameters of decoder layer ``layer_index`` (0-based), by bucket."""
        a, m = self.attention_params(), self.mlp_params(layer_index)
        return LayerParams(a.tp + m.tp, a.replicated + m.replicated, a.experts + m.experts)

    def embedding_params(self) -> int:
        """Input word embedding (+ learned position embedding), unpadded vocab."""
        pos = self.hidden_size * (self.max_position_embeddings or 0)
        return self.vocab_size * self.hidden_size + (pos if self.position_embedding == "learned" else 0)

    def output_params(self) -> int:
        """Output layer (0 when tied to the embedding) plus the final norm."""
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return head + self.norm_params

    def mtp_params(self) -> int:
        """Multi-token-prediction modules (DeepSeek-V3 sec. 2.2): each has two norms, a 2h x h
        projection and one decoder layer (shaped like the last layer); embedding and head shared."""
        per = 2 * self.norm_params + 2 * self.hidden_size**2
        return self.mtp_num_layers * (per + self.layer_params(self.num_layers - 1).total)

    @cached_property
    def num_params(self) -> int:
        """Total parameters of the main model (no MTP), unpadded vocab, tied weights once.

        Oracle: ``shared/reference/ecosystem.md`` 5.2 (e.g. Llama-2-70B = 68,976,648,192).
        """
        layers = sum(self.layer_params(i).total for i in range(self.num_layers))
        return layers + self.embedding_params() + self.output_params()

    @cached_property
    def num_active_params(self) -> int:
        """Parameters touched per token (routed experts counted top-k of E)."""
        inactive = 0
        if self.is_moe:
            per_expert = self._mlp_matrix_params(self.moe_ffn_hidden_size)
            if self.linear_bias:
                per_expert += self.moe_ffn_hidden_size * (2 if self.gated_mlp else 1) + self.hidden_size
            inactive = self.num_moe_layers * (self.num_experts - self.num_experts_per_tok) * per_expert
        return self.num_params - inactive
