"""Megatron-LM command-line arguments for a layout (``pretrain_gpt.py`` flags).

Flag names and rules: ``shared/reference/ecosystem.md`` sections 1.2, 1.3 and 1.5 (Megatron-LM
``core_v0.15.0`` / main). The expert TP size is always written out (its default silently
follows tp); uneven pipeline splits use ``--decoder-first/last-pipeline-num-layers``;
interleaving uses ``--num-virtual-stages-per-pipeline-rank`` (the form that works with uneven
splits too); ZeRO-2/3 map to Megatron FSDP sharding strategies. The flag table itself is in
:mod:`autopar.export.layout_flags`, shared with MindSpeed-LLM and the script rewriter.
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.export.layout_flags import Dialect, flag_words, layout_flags
from autopar.export.layout_flags import needs_max_connections_env as needs_env
from autopar.problem import Problem
from autopar.specs.script_attention import attention_args, dropout_args
from autopar.strategy import Strategy


def model_args(p: Problem, dialect: Dialect = "megatron") -> list[str]:
    """Shape flags of the model (always explicit: Megatron's FFN/kv-channels defaults differ), with
    the RoPE base and norm epsilon of the config where it states them (ecosystem.md 1.5), and the
    flags the cost model assumes of a MoE / MLA layer (:func:`moe_args`); MLA's latent norms
    (``q_a_layernorm`` / ``kv_a_layernorm``) are Megatron's ``--qk-layernorm`` (``gpt_layer_specs``
    builds MLA's ``q_layernorm`` / ``kv_layernorm`` only with it). Not written: rope scaling
    (Llama 3.1 ``--use-rope-scaling``, DeepSeek-V3 YaRN)."""
    m = p.model
    args = [
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--ffn-hidden-size {m.ffn_hidden_size}",
        f"--num-attention-heads {m.num_attention_heads}",
        f"--kv-channels {m.head_dim}",
    ]
    if m.num_kv_heads < m.num_attention_heads and not m.mla:
        args.append(f"--group-query-attention --num-query-groups {m.num_kv_heads}")
    if m.gated_mlp:
        args.append("--swiglu")
    args.append("--normalization " + ("RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    if m.norm_eps is not None:
        args.append(f"--norm-epsilon {m.norm_eps:g}")
    if not m.tie_word_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.linear_bias:
        args.append("--disable-bias-linear")
    if m.qkv_bias and not m.linear_bias:
        args.append("--add-qkv-bias")
    if m.qk_norm or m.mla:
        args.append("--qk-layernorm")
    args.append("--position-embedding-type " + ("rope" if m.position_embedding == "rope" else "learned_absolute"))
    if m.position_embedding == "rope" and m.rope_theta is not None and m.rope_theta.is_integer():
        # Megatron's --rotary-base is an int (default 10000; Llama 3 needs 500000, Qwen 1000000).
        args.append(f"--rotary-base {int(m.rope_theta)}")
    # Megatron asserts the flag is set (arguments.py validate_args); a config without it gets the sequence length.
    args.append(f"--max-position-embeddings {max(m.max_position_embeddings or 0, p.train.seq_len)}")
    args.append(f"--vocab-size {m.vocab_size} --make-vocab-size-divisible-by {p.train.make_vocab_size_divisible_by}")
    # both rates always (ModelSpec.dropout is both masks), at the script's rates, else Megatron's 0.1 each
    args.append(dropout_args(m))
    if m.is_moe:
        args += moe_args(p, dialect)
    if m.mla:
        q_lora = f"--q-lora-rank {m.q_lora_rank} " if m.q_lora_rank else ""
        args.append(f"--multi-latent-attention {q_lora}--kv-lora-rank {m.kv_lora_rank} "
                    f"--qk-head-dim {m.qk_nope_head_dim} --qk-pos-emb-head-dim {m.qk_rope_head_dim} "
                    f"--v-head-dim {m.v_head_dim}")
    if m.mtp_num_layers:
        args.append(f"--mtp-num-layers {m.mtp_num_layers}")
    if (m.window_layers or m.attention_sinks) and dialect != "megatron":
        raise AutoparError("sliding-window layers / attention sinks: MindSpeed-LLM's flags for them are not known "
                           "to autopar; export --format megatron")
    return args + attention_args(m)


def moe_args(p: Problem, dialect: Dialect = "megatron") -> list[str]:
    """MoE flags (ecosystem.md 1.2, 1.5): experts, grouped GEMM, the alltoall dispatcher, the
    layer pattern, shared experts, and the router the cost model assumes.

    * the run's MoE switches (:func:`runtime_args`); the dispatcher and EP overlap are layout
      flags (:func:`autopar.export.layout_flags.layout_flags`);
    * DeepSeek-V3 routing (``router_bias``): sigmoid scores with the expert bias (Megatron-Core's
      ``TransformerConfig`` raises "Expert bias for aux-loss-free routing only supports sigmoid
      score function" otherwise; its default is softmax), group-limited top-k
      (``--moe-router-num-groups`` / ``--moe-router-group-topk``, HF ``n_group`` / ``topk_group``),
      ``--moe-router-topk-scaling-factor`` (HF ``routed_scaling_factor``) and the sequence-wise
      auxiliary loss at the DeepSeek-V3 report's alpha = 0.0001 (sec. 4.2), the router that
      :data:`autopar.cost.host.ROUTER_OPS_DEEPSEEK` counts (Megatron's default coefficient 0 turns
      the loss off);
    * sigmoid scores without a bias (Llama 4, ``router_sigmoid``): ``--moe-router-score-function
      sigmoid``; a softmax top-1 router: ``--moe-router-pre-softmax`` (``TransformerConfig`` raises
      "Please use --moe-router-pre-softmax when topk is 1" otherwise);
    * softmax top-k routers: the config's load-balancing loss coefficient (HF
      ``router_aux_loss_coef``) as ``--moe-aux-loss-coeff``, under Megatron's default
      ``aux_loss`` balancing, the router :data:`autopar.cost.host.ROUTER_OPS_TOPK` counts.

    Raises:
        AutoparError: fp16 in the Megatron-LM dialect (grouped GEMM is bf16 only in Megatron-LM
            v0.15.3, ``arguments.py``), or a MoE switch MindSpeed-LLM does not take.
    """
    m = p.model
    if p.train.precision == "fp16" and dialect == "megatron":  # the reader refuses it too (specs.script_asserts)
        raise AutoparError("fp16 MoE: Megatron-LM v0.15.3 asserts 'Currently GroupedGEMM for MoE only supports bf16 "
                           "dtype.' (megatron/training/arguments.py) and autopar costs the experts as one grouped "
                           "GEMM; use --precision bf16")
    args = [f"--num-experts {m.num_experts} --moe-router-topk {m.num_experts_per_tok} "
            f"--moe-ffn-hidden-size {m.moe_ffn_hidden_size} --moe-grouped-gemm"]
    args += runtime_args(p, dialect)
    if len(m.moe_layers) != m.num_layers:
        pattern = "".join("1" if m.is_moe_layer(i) else "0" for i in range(m.num_layers))
        args.append(f'--moe-layer-freq "[{",".join(pattern)}]"')
    if m.shared_expert_ffn_hidden_size:
        args.append(f"--moe-shared-expert-intermediate-size {m.shared_expert_ffn_hidden_size}")
    if m.router_bias:
        args.append("--moe-router-score-function sigmoid --moe-router-enable-expert-bias")
        if dialect == "megatron":
            args.append("--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4")
    else:
        if m.router_sigmoid:  # Llama 4
            args.append("--moe-router-score-function sigmoid")
        elif m.num_experts_per_tok == 1 and dialect == "megatron":  # TransformerConfig raises without it
            args.append("--moe-router-pre-softmax")
        if m.router_aux_loss_coeff:  # softmax top-k (Mixtral, Qwen3-MoE): Megatron's default aux_loss, coefficient 0
            args.append(f"--moe-aux-loss-coeff {m.router_aux_loss_coeff:g}")
    if m.router_num_groups and dialect == "megatron":
        args.append(f"--moe-router-num-groups {m.router_num_groups} --moe-router-group-topk {m.router_group_topk}")
    if m.router_topk_scaling_factor is not None and dialect == "megatron":
        args.append(f"--moe-router-topk-scaling-factor {m.router_topk_scaling_factor:g}")
    return args


def runtime_args(p: Problem, dialect: Dialect = "megatron") -> list[str]:
    """The plan's ``TrainSpec.moe`` switches as Megatron-LM flags: ``--moe-permute-fusion``
    (:data:`autopar.cost.host.DISPATCH_OPS` counts one fused permute), ``--moe-router-fusion``,
    ``--moe-shared-expert-overlap``, ``--delay-wgrad-compute``, ``--moe-router-force-load-balancing``,
    ``--moe-router-padding-for-fp8``,
    ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity``, and
    ``--moe-router-dtype fp32`` (:func:`autopar.cost.moe.moe_block_bytes` keeps fp32 router logits).
    Megatron-Core >= 0.13 flags: in the MindSpeed dialect only the defaults are written.

    Raises:
        AutoparError: a switch other than the permutation fusion in MindSpeed-LLM's dialect.
    """
    moe = p.train.moe
    if dialect != "megatron":
        changed = [name for name in ("router_fusion", "shared_expert_overlap", "delay_wgrad", "force_balance",
                                     "router_padding_for_fp8")
                   if getattr(moe, name)] + (["capacity_factor"] if moe.capacity_factor is not None else [])
        if changed:
            raise AutoparError(f"MindSpeed-LLM: the MoE switches {', '.join(changed)} are Megatron-Core's, not modelled "
                               "in MindSpeed-LLM's flags; export --format megatron")
        return []
    flags = {"--moe-permute-fusion": moe.permute_fusion, "--moe-router-fusion": moe.router_fusion,
             "--moe-shared-expert-overlap": moe.shared_expert_overlap, "--delay-wgrad-compute": moe.delay_wgrad,
             "--moe-router-force-load-balancing": moe.force_balance,
             "--moe-router-padding-for-fp8": moe.router_padding_for_fp8}
    args = [" ".join(name for name, on in flags.items() if on) + " --moe-router-dtype fp32"]
    if moe.capacity_factor is not None:
        args.append(f"--moe-expert-capacity-factor {moe.capacity_factor:g}"
                    + (" --moe-pad-expert-input-to-capacity" if moe.pad_to_capacity else ""))
    return [a.strip() for a in args]


def parallel_args(p: Problem, s: Strategy, dialect: Dialect = "megatron") -> list[str]:
    """Parallel layout, batch, recompute and optimizer-sharding flags, then sequence length,
    precision and attention kernel (:func:`autopar.export.layout_flags.layout_flags`).

    Raises:
        AutoparError: the layout cannot be expressed in ``dialect``.
    """
    args = flag_words(layout_flags(p, s, dialect))
    args.append(f"--seq-length {p.train.seq_len}")
    args.append("--" + p.train.precision if p.train.precision != "fp8" else precision_flags(p))
    if p.train.fp8_param_storage:
        args.append(fp8_param_gather_flag(s))
    if p.train.activation_offload_layers:
        args.append(activation_offload_flag(p, dialect))
    if p.train.bf16_end_layers != (0, 0):  # autopar.cost.fp8_bf16_layers; Megatron-LM _add_transformer_engine_args
        first, last = p.train.bf16_end_layers
        args.append(f"--first-last-layers-bf16 --num-layers-at-start-in-bf16 {first} --num-layers-at-end-in-bf16 {last}")
    if p.train.cuda_graph_impl != "none":  # autopar.cost.cuda_graph; MindSpeed refuses it (layout_flags)
        args.append(cuda_graph_flags(p))
    args.extend(optimizer_state_args(p, dialect))
    if dialect == "megatron":  # Megatron-LM's AttnBackend: auto picks a fused kernel; unfused is the full score matrix
        args.append("--attention-backend " + ("auto" if p.train.flash_attention else "unfused"))
    elif p.train.flash_attention:  # MindSpeed runs Megatron's unfused attention without it (specs.script.flash_attention)
        args.append("--use-flash-attn")
    return args


#: ``--cuda-graph-scope`` values Megatron-LM core_v0.15 takes (one of them: ``full`` is the whole layer).
V015_GRAPH_SCOPES = ((), ("attn",), ("full_iteration",))


def cuda_graph_flags(p: Problem) -> str:
    """``--cuda-graph-impl`` (and ``--cuda-graph-scope``) of ``TrainSpec.cuda_graph_impl`` /
    ``cuda_graph_scope``, in the form both Megatron-LM core_v0.15 and main read: main keeps
    ``--cuda-graph-scope`` as the deprecated alias of ``--cuda-graph-modules`` (several names) and
    migrates ``local`` + ``full_iteration`` to ``--cuda-graph-impl full_iteration``. The whole-step
    graph adds ``--no-check-for-nan-in-loss-and-grad``, which both assert ("should be set with
    full_iteration CUDA graph", ``arguments.py``). A scope core_v0.15 does not take (it has one value
    of ``full``, ``attn``, ``full_iteration``) needs main: :func:`launch_script` says so. Checked with
    ``megatron_check.py`` (Megatron-LM d98e8a6)."""
    scope = p.train.cuda_graph_scope
    out = f"--cuda-graph-impl {p.train.cuda_graph_impl}" + (f" --cuda-graph-scope {' '.join(scope)}" if scope else "")
    if "full_iteration" in scope:
        out += " --no-check-for-nan-in-loss-and-grad"
    return out


def activation_offload_flag(p: Problem, dialect: Dialect) -> str:
    """``--cpu-offloading-num-layers N`` for ``TrainSpec.activation_offload_layers``
    (:mod:`autopar.cost.activation_offload`). The flag is Megatron-LM main's: its
    ``_add_network_size_args`` makes flags of the ``ModelParallelConfig`` fields, and
    ``validate_args`` sets ``cpu_offloading`` when the count is above 0 (checked with
    ``megatron_check.py`` of the real-client drivers at d98e8a6). Megatron-LM core_v0.15 has no
    ``--cpu-offloading-*`` flag: the script then needs a newer Megatron-LM (or
    ``--format megatron-bridge``, ``model.cpu_offloading``), as a comment in :func:`launch_script` says.

    Raises:
        AutoparError: the MindSpeed-LLM dialect (its Megatron base has no such flag)."""
    if dialect != "megatron":
        raise AutoparError(f"activation CPU offloading ({p.train.activation_offload_layers} layers): MindSpeed-LLM "
                           "has no --cpu-offloading-num-layers (its own --swap-attention is another mechanism); plan "
                           "without --activation-offload-layers")
    return f"--cpu-offloading-num-layers {p.train.activation_offload_layers}"


def precision_flags(p: Problem) -> str:
    """Megatron-LM (core_v0.15) flags of fp8 training with ``TrainSpec.fp8_recipe``: ``--bf16
    --fp8-format hybrid --fp8-recipe R`` (``delayed``, ``tensorwise``, ``blockwise``, ``mxfp8``), or
    ``--bf16 --fp4-format e2m1 --fp4-recipe nvfp4`` for NVFP4 (``arguments.py``
    ``_add_transformer_engine_args``). The device check is the cost model's
    (:func:`autopar.cost.fp8_recipe.check_device`)."""
    if p.train.effective_fp8_recipe == "nvfp4":
        return "--bf16 --fp4-format e2m1 --fp4-recipe nvfp4"
    return f"--bf16 --fp8-format hybrid --fp8-recipe {p.train.effective_fp8_recipe}"


def fp8_param_gather_flag(s: Strategy) -> str:
    """``--fp8-param-gather`` for ``TrainSpec.fp8_param_storage`` (weights kept only in fp8 and
    all-gathered in fp8).

    Raises:
        AutoparError: zero 0: Megatron-LM asserts "--fp8-param-gather only supported with
            distributed optimizer, torch fsdp2, megatron fsdp" (``megatron/training/arguments.py``).
    """
    if s.zero == 0:
        raise AutoparError("fp8 parameter storage (--fp8-param-gather) with zero=0: Megatron-LM supports it only "
                           "with the distributed optimizer or FSDP; use zero >= 1")
    return "--fp8-param-gather"


def optimizer_state_args(p: Problem, dialect: Dialect = "megatron") -> list[str]:
    """Gradient / optimizer-state dtypes and optimizer offload, as :mod:`autopar.specs.script_optimizer`
    reads them back: ``--use-precision-aware-optimizer`` with the dtypes that are not fp32,
    ``--optimizer-cpu-offload --optimizer-offload-fraction F`` (``--overlap-cpu-optimizer-d2h-h2d``);
    bf16 main gradients alone are ``--grad-reduce-in-bf16``; fp16 training with fp32 gradients is
    ``--accumulate-allreduce-grads-in-fp32`` (Megatron keeps fp16 gradients without it). Nothing for
    Megatron's defaults.

    Raises:
        AutoparError: any of them for MindSpeed-LLM (``dialect='mindspeed'``), whose flags autopar
            does not know.
    """
    t = p.train
    aware = t.optimizer_dtypes_set or t.optimizer_offload_fraction > 0
    # fp16 training: fp16 gradients unless --accumulate-allreduce-grads-in-fp32 (Megatron-LM main training.py:
    # grad_reduce_in_fp32 = args.accumulate_allreduce_grads_in_fp32; MindSpeed-LLM's Megatron-Core reads it too)
    fp16_grads = ["--accumulate-allreduce-grads-in-fp32"] if t.precision == "fp16" and t.grad_dtype == "fp32" else []
    if not (aware or (t.grad_dtype != "fp32" and t.precision != "fp16")):
        return fp16_grads
    if dialect != "megatron":
        raise AutoparError("optimizer dtypes / optimizer offload / bf16 main gradients: MindSpeed-LLM's flags for "
                           "them are not known to autopar; export --format megatron")
    if not aware:
        return ["--grad-reduce-in-bf16"]
    words = fp16_grads + ["--use-precision-aware-optimizer"]
    dtypes = {"--main-grads-dtype": t.grad_dtype if t.precision != "fp16" else "fp32",
              "--main-params-dtype": t.main_params_dtype,
              "--exp-avg-dtype": t.exp_avg_dtype, "--exp-avg-sq-dtype": t.exp_avg_sq_dtype}
    words += [f"{flag} {value}" for flag, value in dtypes.items() if value != "fp32"]
    if t.optimizer_offload_fraction > 0:
        words.append(f"--optimizer-cpu-offload --optimizer-offload-fraction {t.optimizer_offload_fraction:g}")
        if t.optimizer_offload_overlap:
            words.append("--overlap-cpu-optimizer-d2h-h2d")
    return [" ".join(words)]


def needs_max_connections_env(p: Problem, s: Strategy) -> bool:
    """Megatron asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1`` when tp > 1 or cp > 1 (pre-Blackwell)
    without Megatron-FSDP, and refuses it with FSDP (:func:`autopar.export.layout_flags.needs_max_connections_env`)."""
    return needs_env(s)


def megatron_args(p: Problem, s: Strategy, dialect: Dialect = "megatron", extra: tuple[str, ...] = ()) -> str:
    """All flags, one per line with shell continuations, ready to paste into a launch script.

    Raises:
        AutoparError: the layout cannot be expressed in ``dialect``.
    """
    lines = parallel_args(p, s, dialect) + model_args(p, dialect) + list(extra)
    body = " \\\n    ".join(lines)
    env = "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" if needs_max_connections_env(p, s) else ""
    return f"{env}    {body}"


def launch_script(p: Problem, s: Strategy, dialect: Dialect = "megatron", extra: tuple[str, ...] = ()) -> str:
    """A minimal launch script: the env export Megatron asserts, a comment naming what is the
    user's to add (data, tokenizer and checkpoint flags, ``--train-iters``, the multi-node
    rendezvous; and why ``--ckpt-format`` is switched where Megatron-FSDP needs ``fsdp_dtensor``),
    then ``torchrun`` with the cluster shape and every flag.

    Raises:
        AutoparError: the layout cannot be expressed in ``dialect``.
    """
    args = megatron_args(p, s, dialect, extra)
    env, _, body = args.partition("\n") if args.startswith("export") else ("", "", args)
    framework = "MindSpeed-LLM" if dialect == "mindspeed" else "Megatron-LM"
    head = "#!/bin/bash\n" + (env + "\n" if env else "") + (
        f"# {framework} launch written by autopar export: the layout, batch, precision and model flags only.\n"
        "# Yours to add: data, tokenizer and checkpoint flags (--data-path, --tokenizer-type, --save/--load)\n"
        "# and the run length (--train-iters), and on several nodes the rendezvous on each node\n"
        "# (--node_rank N --master_addr HOST --master_port PORT, or --rdzv-backend c10d --rdzv-endpoint HOST:PORT).\n")
    if "--ckpt-format fsdp_dtensor" in body:
        head += ("# --ckpt-format fsdp_dtensor: Megatron-FSDP (--use-megatron-fsdp) needs this checkpoint format\n"
                 "# (Megatron-LM's megatron-fsdp user guide, 'Required Configurations'): a checkpoint saved in\n"
                 "# another (torch_dist by default) must be converted before --load.\n")
    if p.train.activation_offload_layers and dialect == "megatron":
        head += "# --cpu-offloading-num-layers needs Megatron-LM main (after core_v0.15, which has no such flag)\n"
    if p.train.cuda_graph_impl != "none" and p.train.cuda_graph_scope not in V015_GRAPH_SCOPES:
        head += "# --cuda-graph-scope with these names needs Megatron-LM main (core_v0.15 takes full, attn or full_iteration)\n"
    return (f"{head}torchrun --nnodes {p.cluster.num_nodes} --nproc_per_node {p.cluster.devices_per_node} "
            f"pretrain_gpt.py \\\n{body}\n")


def write(p: Problem, s: Strategy) -> str:
    """The ``megatron`` export format: :func:`launch_script` for Megatron-LM."""
    return launch_script(p, s, "megatron")
