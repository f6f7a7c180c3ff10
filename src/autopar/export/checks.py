"""Megatron-LM and MindSpeed-LLM validity rules, re-checked on arguments read back from a script.

Each predicate takes the read-back :class:`~autopar.specs.script.ScriptPlan` and returns the
reason it fails, or None. Rule numbers are those of ``shared/reference/ecosystem.md`` 1.3;
the MindSpeed ones are section 2. :func:`violations` runs the list for a framework.
"""

from __future__ import annotations

from typing import Callable

from autopar.specs.script import ScriptPlan

Check = Callable[[ScriptPlan], "str | None"]


def _world(p: ScriptPlan) -> int:
    return p.num_nodes * p.devices_per_node


def _dp(p: ScriptPlan) -> int:
    lay = p.layout
    return _world(p) // (lay["tp"] * lay["pp"] * lay["cp"])


def world_divisible(p: ScriptPlan) -> str | None:
    """Rule 1: world % (tp*pp*cp) == 0."""
    lay = p.layout
    n = lay["tp"] * lay["pp"] * lay["cp"]
    return None if _world(p) % n == 0 else f"world size {_world(p)} is not divisible by tp*pp*cp = {n}"


def expert_grid(p: ScriptPlan) -> str | None:
    """Rule 2: world % (etp*ep*pp) == 0."""
    lay = p.layout
    n = lay["etp"] * lay["ep"] * lay["pp"]
    return None if _world(p) % n == 0 else f"world size {_world(p)} is not divisible by etp*ep*pp = {n}"


def batch_divisible(p: ScriptPlan) -> str | None:
    """Rule 5: gbs % (mbs*dp) == 0 and at least one micro-batch."""
    gbs, mbs = p.train_fields["global_batch_size"], p.layout["mbs"]
    ok = gbs % (mbs * _dp(p)) == 0 and gbs >= mbs * _dp(p)
    return None if ok else f"global batch {gbs} is not divisible by mbs*dp = {mbs}*{_dp(p)}"


def heads_divisible(p: ScriptPlan) -> str | None:
    """Rules 6 and 7: heads % tp == 0; query groups a multiple or divisor of tp."""
    tp, heads, groups = p.layout["tp"], p.model_fields["num_attention_heads"], p.model_fields["num_kv_heads"]
    if heads % tp:
        return f"num_attention_heads {heads} is not a multiple of tp {tp}"
    return None if groups % tp == 0 or tp % groups == 0 else f"num_query_groups {groups} vs tp {tp}"


def sp_needs_tp(p: ScriptPlan) -> str | None:
    """Rule 8: sequence parallelism needs tp > 1."""
    return "--sequence-parallel with tp=1" if p.args.has("--sequence-parallel") and p.layout["tp"] == 1 else None


def cp_divides_seq(p: ScriptPlan) -> str | None:
    """Rule 11: cp > 1 needs seq % (2*cp) == 0."""
    cp, seq = p.layout["cp"], p.train_fields["seq_len"]
    return None if cp == 1 or seq % (2 * cp) == 0 else f"seq {seq} is not a multiple of 2*cp = {2 * cp}"


def experts_divisible(p: ScriptPlan) -> str | None:
    """Rule 13: ep > 1 needs num_experts % ep == 0."""
    ep, experts = p.layout["ep"], p.model_fields.get("num_experts", 0)
    return None if ep == 1 or (experts and experts % ep == 0) else f"{experts} experts over ep={ep}"


def expert_bias_needs_sigmoid(p: ScriptPlan) -> str | None:
    """Megatron-Core ``TransformerConfig.__post_init__``: ``--moe-router-enable-expert-bias``
    (aux-loss-free routing) needs ``--moe-router-score-function sigmoid`` (the default is softmax);
    ValueError "Expert bias for aux-loss-free routing only supports sigmoid score function"."""
    if not p.args.has("--moe-router-enable-expert-bias"):
        return None
    score = p.args.text("--moe-router-score-function", "softmax")
    return None if score == "sigmoid" else f"--moe-router-enable-expert-bias with score function {score}"


def one_vpp_form(p: ScriptPlan) -> str | None:
    """Rules 17, 18, 22: one VPP form; no layers-per-vstage with uneven stages; no layout string."""
    forms = [f for f in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                         "--pipeline-model-parallel-layout") if p.args.has(f)]
    if len(forms) > 1:
        return f"more than one VPP form: {forms}"
    uneven = p.args.has("--decoder-first-pipeline-num-layers") or p.args.has("--decoder-last-pipeline-num-layers")
    if uneven and p.args.has("--num-layers-per-virtual-pipeline-stage"):
        return "uneven first/last stages with --num-layers-per-virtual-pipeline-stage"
    return None


def interleave_needs_pp(p: ScriptPlan) -> str | None:
    """Rule 19: interleaving needs pp > 1 (pp > 2 without p2p overlap)."""
    vpp, pp = p.layout["vpp"], p.layout["pp"]
    floor = 2 if p.args.has("--no-overlap-p2p-communication") else 1
    return None if vpp == 1 or pp > floor else f"vpp={vpp} needs pp > {floor}, got {pp}"


def stage_split(p: ScriptPlan) -> str | None:
    """Rules 20, 21 (and MindSpeed's ``--num-layer-list``): every stage and chunk gets whole,
    non-empty layer counts that sum to num_layers. With the embedding/loss counted as layers
    (rule 21) ``L' = L + e + l`` must split into whole model chunks of >= 2 slots."""
    lay, layers = p.layout, p.model_fields["num_layers"]
    extra = int(lay.get("account_for_embedding", False)) + int(lay.get("account_for_loss", False))
    if extra:
        chunks = lay["pp"] * lay["vpp"]
        ok = (layers + extra) % chunks == 0 and ((layers + extra) // chunks >= 2 or chunks == 1)
        return None if ok else (f"num_layers {layers} + {extra} (embedding/loss) is not a multiple of "
                                f"pp*vpp = {chunks} with >= 2 per chunk")
    split = lay["layers_per_stage"] or ((layers // lay["pp"],) * lay["pp"] if layers % lay["pp"] == 0 else None)
    if split is None:
        return f"num_layers {layers} is not divisible by pp {lay['pp']}"
    if len(split) != lay["pp"] or sum(split) != layers:
        return f"split {split} does not give {layers} layers over pp={lay['pp']}"
    if any(n < 1 or n % lay["vpp"] for n in split):
        return f"split {split}: every stage needs >= 1 layer and a multiple of vpp={lay['vpp']}"
    return None


def interleaved_microbatches(p: ScriptPlan) -> str | None:
    """Rule 23: interleaving needs num_microbatches % pp == 0."""
    lay = p.layout
    m = p.train_fields["global_batch_size"] // (lay["mbs"] * _dp(p))
    return None if lay["vpp"] == 1 or m % lay["pp"] == 0 else f"{m} micro-batches is not a multiple of pp={lay['pp']}"


def recompute_args(p: ScriptPlan) -> str | None:
    """Rule 24: full needs method and num-layers; selective forbids both."""
    gran = p.args.text("--recompute-granularity")
    has = p.args.has("--recompute-method") or p.args.has("--recompute-num-layers")
    if gran == "full" and not (p.args.has("--recompute-method") and p.args.has("--recompute-num-layers")):
        return "full recompute without --recompute-method and --recompute-num-layers"
    return "recompute method/num-layers without full granularity" if gran != "full" and has else None


def recompute_modules(p: ScriptPlan) -> str | None:
    """Rule 25: ``moe_act`` needs ``--moe-grouped-gemm``, ``mla_up_proj`` needs
    ``--multi-latent-attention``, ``shared_experts`` conflicts with ``--moe-shared-expert-overlap``."""
    modules = p.layout["recompute_modules"] if p.layout["recompute"] == "selective" else ()
    if "moe_act" in modules and not p.args.has("--moe-grouped-gemm"):
        return "--recompute-modules moe_act without --moe-grouped-gemm"
    if "mla_up_proj" in modules and not p.args.has("--multi-latent-attention"):
        return "--recompute-modules mla_up_proj without --multi-latent-attention"
    if "shared_experts" in modules and p.args.has("--moe-shared-expert-overlap"):
        return "--recompute-modules shared_experts with --moe-shared-expert-overlap"
    return None


def overlap_param_gather(p: ScriptPlan) -> str | None:
    """Rule 28: param-gather overlap needs the distributed optimizer (or FSDP) and grad overlap."""
    if not p.args.has("--overlap-param-gather"):
        return None
    sharded = p.args.has("--use-distributed-optimizer") or p.args.has("--use-megatron-fsdp")
    return None if sharded and p.args.has("--overlap-grad-reduce") else "--overlap-param-gather without its needs"


def one_precision(p: ScriptPlan) -> str | None:
    """Rule 33: --fp16 and --bf16 are exclusive; max_position_embeddings >= seq_length."""
    if p.args.has("--fp16") and p.args.has("--bf16"):
        return "--fp16 with --bf16"
    pos, seq = p.model_fields["max_position_embeddings"], p.train_fields["seq_len"]
    return None if pos >= seq else f"--max-position-embeddings {pos} < --seq-length {seq}"


def layer_list_rules(p: ScriptPlan) -> str | None:
    """MindSpeed-LLM (section 2): ``--num-layer-list`` needs pp > 1, one entry per stage, and no
    ``--num-layers-per-virtual-pipeline-stage``."""
    if not p.args.has("--num-layer-list"):
        return None
    split = p.layout["layers_per_stage"] or ()
    if p.layout["pp"] == 1 or len(split) != p.layout["pp"]:
        return f"--num-layer-list {split} with pp={p.layout['pp']}"
    return "--num-layer-list with VPP" if p.args.has("--num-layers-per-virtual-pipeline-stage") else None


MEGATRON_CHECKS: tuple[Check, ...] = (
    world_divisible, expert_grid, batch_divisible, heads_divisible, sp_needs_tp, cp_divides_seq,
    experts_divisible, expert_bias_needs_sigmoid, one_vpp_form, interleave_needs_pp, stage_split, interleaved_microbatches, recompute_args,
    recompute_modules, overlap_param_gather, one_precision,
)
MINDSPEED_CHECKS: tuple[Check, ...] = MEGATRON_CHECKS + (layer_list_rules,)


def violations(plan: ScriptPlan) -> list[str]:
    """Every rule the read-back script breaks, as ``name: reason`` (empty when valid)."""
    checks = MINDSPEED_CHECKS if plan.framework == "mindspeed" else MEGATRON_CHECKS
    return [f"{c.__name__}: {why}" for c in checks if (why := c(plan))]
