"""Read a Megatron-LM / MindSpeed-LLM launch script into a model, a training job and a layout.

The script is evaluated by :class:`autopar.specs.bash.ShellScript` (no bash is run); the
launch command (``torchrun``, ``python -m torch.distributed.run`` / ``.launch``, or ``python
train.py``, found by :mod:`autopar.specs.script_launch`) gives the cluster shape (``--nnodes``,
``--nproc_per_node``) and the arguments of the training script. Flag names and defaults are Megatron-LM's (``shared/reference/ecosystem.md``
1.2, 1.5; ``megatron/training/arguments.py``) plus MindSpeed-LLM's (section 2).

Documented defaults (what Megatron itself does when a flag is absent): ``--ffn-hidden-size`` 4h,
or ``int(4h*2/3/64)*64`` with ``--swiglu``; ``--kv-channels`` h/heads; LayerNorm; tied
embeddings; linear biases on; learned absolute positions (``--use-rotary-position-embeddings`` makes them
rope whatever ``--position-embedding-type`` says, as ``validate_args`` does); dropout 0.1; ``--moe-router-topk`` 2;
``--moe-ffn-hidden-size`` = FFN; MLA ranks ``--kv-lora-rank`` 32, ``--qk-head-dim`` 128,
``--qk-pos-emb-head-dim`` 64, ``--v-head-dim`` 128; ``--micro-batch-size`` 1; global batch
mbs*dp; ``--make-vocab-size-divisible-by`` 128; torchrun's ``--nnodes 1 --nproc_per_node 1``.
The vocabulary size is read from ``--vocab-size``, a ``--vocab-file`` (GPT-2 BPE JSON) or a
Hugging Face tokenizer folder's ``config.json``; otherwise it is an error asking for
``--vocab-size`` (a SentencePiece model file is not read).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autopar.errors import AutoparError, from_validation_error, read_text
from autopar.specs.bash import ShellScript, check_script_size
from autopar.specs.model import ModelSpec
from autopar.specs.script_asserts import check_megatron_asserts, check_transformer_impl
from autopar.specs.script_attention import attention_fields, dropout_fields
from autopar.specs.script_comm import comm_fields
from autopar.specs.script_flags import check_flags
from autopar.specs.script_fsdp import check_torch_fsdp2
from autopar.specs.script_knob_asserts import check_knob_asserts
from autopar.specs.script_launch import Args, find_launch
from autopar.specs.script_layers import apply_noop_layers
from autopar.specs.script_moe import dispatcher_fields, runtime_fields
from autopar.specs.script_optimizer import optimizer_fields
from autopar.specs.script_precision import precision, recipe_fields
from autopar.specs.script_recompute import recompute_fields
from autopar.specs.script_vocab import null_tokenizer_vocab, padded_vocab_size, vocab_size
from autopar.specs.train import MOE_CUDA_GRAPH_SCOPES, TrainSpec
from autopar.strategy import Strategy

_FSDP_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
# Megatron-LM's --position-embedding-type choices (arguments.py); only learned_absolute adds parameters.
_POSITION_TYPES = ("learned_absolute", "rope", "mrope", "relative", "none")
# Flags only MindSpeed / MindSpeed-LLM define (ecosystem.md section 2): their presence marks the script.
MINDSPEED_FLAGS = frozenset({
    "--num-layer-list", "--noop-layers", "--context-parallel-algo", "--use-fused-rmsnorm", "--use-fused-swiglu",
    "--use-fused-rotary-pos-emb", "--use-ascend-mc2", "--moe-tp-extend-ep", "--swap-attention", "--reuse-fp32-param",
    "--recompute-activation-function", "--recompute-norm", "--pipeline-num-transformer-layers", "--schedules-method",
    "--tokenizer-name-or-path", "--use-mc2", "--n-shared-experts", "--first-k-dense-replace",
})


@dataclass
class ScriptPlan:
    """Everything a launch script says about the job (see the module docstring).

    ``model`` is None when the vocabulary is unknown (``vocab_error`` says how to supply it);
    :meth:`model_spec` builds it with a vocabulary given on the command line.
    """

    path: Path
    text: str
    framework: str
    args: Args
    num_nodes: int
    devices_per_node: int
    model_fields: dict[str, Any]
    vocab_error: str | None
    train_fields: dict[str, Any]
    layout: dict[str, Any] = field(default_factory=dict)

    def model_spec(self, vocab_size: int | None = None) -> ModelSpec:
        """The :class:`ModelSpec`; ``vocab_size`` overrides the script's.

        Raises:
            AutoparError: vocabulary unknown, an invalid shape, or ``vocab_size`` other than the
                script's ``--padded-vocab-size`` (Megatron builds the embedding with the padded
                size whatever the tokenizer's vocabulary, :mod:`autopar.specs.script_vocab`).
        """
        fields = dict(self.model_fields)
        if vocab_size is not None and self.args.has("--padded-vocab-size") and vocab_size != fields["vocab_size"]:
            raise AutoparError(f"--vocab-size={vocab_size} conflicts with {self.path.name}: --padded-vocab-size "
                               f"{fields['vocab_size']} (Megatron builds the embedding and output layer with the "
                               "padded size, whatever the tokenizer's vocabulary); drop --vocab-size")
        if vocab_size is not None:
            fields["vocab_size"] = vocab_size
        elif self.vocab_error:
            raise AutoparError(self.vocab_error)
        try:
            return ModelSpec.model_validate(fields, context={"names": MODEL_FLAGS})
        except ValidationError as err:
            raise from_validation_error(err, self.path.name, names=MODEL_FLAGS) from None

    def strategy(self, world_size: int, num_layers: int) -> Strategy:
        """The script's layout on ``world_size`` devices.

        Raises:
            AutoparError: tp*pp*cp does not divide the world size.
        """
        lay = self.layout
        model = lay["tp"] * lay["pp"] * lay["cp"]
        if world_size % model:
            raise AutoparError(f"{self.path.name}: tp*pp*cp = {model} does not divide the world size {world_size}")
        return Strategy(dp=world_size // model, schedule="interleaved" if lay["vpp"] > 1 else "1f1b", **lay)


def read_script(path: str | Path, text: str | None = None) -> ScriptPlan:
    """Read a launch script file (or ``text`` under that name) into a :class:`ScriptPlan`.

    A file over :data:`autopar.specs.bash.MAX_SCRIPT_CHARS` bytes is refused before it is read
    (the other reading bounds: :mod:`autopar.specs.bash`).

    Raises:
        AutoparError: unreadable file, a file beyond the reading bounds, no launch command, a
            required flag missing, a value only known at run time, fp32 training (autopar plans
            bf16/fp16/fp8).
    """
    path = Path(path)
    if text is None:
        try:
            # a regular file: its size before reading it (a FIFO has none); os.path.isfile is False
            # for a name the file system cannot hold (Path.is_file raised), which read_text names
            if os.path.isfile(path):
                check_script_size(path.stat().st_size, 0)
        except AutoparError as err:
            raise AutoparError(f"--script={str(path)!r}: {err}") from None
        text = read_text(path, "--script", "a bash launch script is UTF-8 text")
    try:
        sh = ShellScript(text)
    except AutoparError as err:  # the reader does not know the file's name
        raise AutoparError(f"{path.name}: {err}") from None
    launch = find_launch(sh, path.name)
    a = launch.args
    check_flags(a)
    check_torch_fsdp2(a, _scalar_variable(sh, "CUDA_DEVICE_MAX_CONNECTIONS"))
    framework = "mindspeed" if any(a.has(f) for f in MINDSPEED_FLAGS) else "megatron"
    check_transformer_impl(a, framework)
    fields, vocab_error = model_fields(a, path)
    if fields.get("vocab_size") is not None:  # MindSpeed-LLM's NullTokenizer appends an end-of-document id
        fields["vocab_size"] = null_tokenizer_vocab(a, fields["vocab_size"], framework)
    mbs = a.integer("--micro-batch-size", 1)
    layout = layout_fields(a, fields["num_layers"])
    layout.update(comm_fields(a, framework, fields["num_layers"], layout))
    if fields.get("num_experts"):
        layout.update(dispatcher_fields(a))
    fields, layout = apply_noop_layers(a, fields, layout, stage_split)
    padded = padded_vocab_size(a, fields.get("vocab_size"), layout["tp"])
    if padded is not None:  # the embedding size itself: no vocabulary to ask for, nothing more to pad
        fields["vocab_size"], vocab_error = padded, None
    world = launch.nnodes * launch.nproc_per_node
    dp = max(1, world // (layout["tp"] * layout["pp"] * layout["cp"]))
    train = dict(global_batch_size=a.integer("--global-batch-size", mbs * dp), seq_len=a.require("--seq-length"),
                 precision=precision(a), flash_attention=flash_attention(a, framework),
                 make_vocab_size_divisible_by=1 if padded else a.integer("--make-vocab-size-divisible-by", 128),
                 # Megatron-LM reduces gradients after the last backward unless told to overlap
                 overlap_grad_reduce=a.has("--overlap-grad-reduce"),
                 # Megatron-LM's --no-gradient-accumulation-fusion (autopar.cost.wgrad_accumulation)
                 grad_accumulation_fusion=not a.has("--no-gradient-accumulation-fusion"),
                 **optimizer_fields(a))
    check_megatron_asserts(a)  # after precision(): a script without --bf16/--fp16 is named fp32 first
    train.update(recipe_fields(a, train["precision"]))  # fp8 recipe and weight storage, CUDA graphs
    moe_scopes = [w for w in train.get("cuda_graph_scope", ()) if w in MOE_CUDA_GRAPH_SCOPES]
    if moe_scopes and not fields.get("num_experts"):  # was accepted and costed as no graph
        raise AutoparError(f"{a.source}: --cuda-graph-scope {' '.join(moe_scopes)} captures MoE layers and the model "
                           "has none (no --num-experts); use attn or mlp")
    if fields.get("num_experts"):
        train["moe"] = runtime_fields(a, layout["moe_dispatcher"])
    check_knob_asserts(a, fields, layout, train)  # Megatron-LM main's asserts among modelled knobs
    return ScriptPlan(path=path, text=text, framework=framework, args=a, num_nodes=launch.nnodes,
                      devices_per_node=launch.nproc_per_node, model_fields=fields, vocab_error=vocab_error,
                      train_fields=train, layout=layout)


def _scalar_variable(sh: ShellScript, name: str) -> str | None:
    """A scalar variable the script sets (an environment variable it exports), None if unset."""
    value = sh.variables.get(name)
    return value if isinstance(value, str) else None


def train_spec(plan: ScriptPlan, **overrides: Any) -> TrainSpec:
    """The script's :class:`TrainSpec`, with non-None ``overrides`` (CLI options) applied."""
    fields = {**plan.train_fields, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return TrainSpec(**fields)
    except ValidationError as err:
        raise from_validation_error(err, f"{plan.path.name}: training") from None


def flash_attention(a: Args, framework: str = "megatron") -> bool:
    """Whether the script runs fused attention.

    Megatron-LM: fused unless ``--attention-backend unfused`` (the default ``auto`` picks a fused
    kernel; ``local`` is refused by :mod:`autopar.specs.script_knob_asserts`). MindSpeed-LLM
    (``framework`` mindspeed): fused only with ``--use-flash-attn``, since MindSpeed's
    ``mindspeed/core/transformer/dot_product_attention.py`` ``dot_product_attention_forward_wrapper``
    runs its fused kernel ``if get_args().use_flash_attn`` and otherwise Megatron's unfused
    ``DotProductAttention.forward`` (the full score matrix), which autopar costs as
    ``--attention-backend unfused``.

    Raises:
        AutoparError: an ``--attention-backend`` outside Megatron's ``AttnBackend`` choices.
    """
    backend = a.text("--attention-backend", "auto")
    if backend not in ("flash", "fused", "unfused", "local", "auto"):  # Megatron's AttnBackend enum
        raise AutoparError(f"{a.source}: --attention-backend={backend!r}: allowed flash, fused, unfused, local, auto")
    if framework == "mindspeed" and not a.has("--use-flash-attn"):
        return False
    return backend not in ("unfused", "local")


#: ModelSpec field -> the Megatron-LM flag :func:`model_fields` reads it from (errors name the flag).
MODEL_FLAGS = {
    "num_layers": "--num-layers", "hidden_size": "--hidden-size", "num_attention_heads": "--num-attention-heads",
    "num_kv_heads": "--num-query-groups", "head_dim": "--kv-channels", "ffn_hidden_size": "--ffn-hidden-size",
    "vocab_size": "--vocab-size", "max_position_embeddings": "--max-position-embeddings",
    "mtp_num_layers": "--mtp-num-layers", "rope_theta": "--rotary-base", "norm_eps": "--norm-epsilon",
    "num_experts": "--num-experts", "num_experts_per_tok": "--moe-router-topk",
    "moe_ffn_hidden_size": "--moe-ffn-hidden-size", "shared_expert_ffn_hidden_size": "--moe-shared-expert-intermediate-size",
    "router_aux_loss_coeff": "--moe-aux-loss-coeff", "router_num_groups": "--moe-router-num-groups",
    "router_group_topk": "--moe-router-group-topk", "router_topk_scaling_factor": "--moe-router-topk-scaling-factor",
    "q_lora_rank": "--q-lora-rank", "kv_lora_rank": "--kv-lora-rank", "qk_nope_head_dim": "--qk-head-dim",
    "qk_rope_head_dim": "--qk-pos-emb-head-dim", "v_head_dim": "--v-head-dim",
}


def model_fields(a: Args, path: Path) -> tuple[dict[str, Any], str | None]:
    """ModelSpec fields from the shape flags, and the vocabulary error if it is unknown."""
    h, heads = a.require("--hidden-size"), a.require("--num-attention-heads")
    for flag, value in (("--hidden-size", h), ("--num-attention-heads", heads)):
        if value < 1:
            raise AutoparError(f"{a.source}: {flag}={value}: must be an integer >= 1")
    if not a.has("--kv-channels") and h % heads:  # Megatron arguments.py asserts it before kv_channels = h // heads
        raise AutoparError(f"{a.source}: --hidden-size={h} is not divisible by --num-attention-heads={heads}; "
                           "Megatron-LM asserts it unless --kv-channels is given")
    gated = a.has("--swiglu")
    ffn = a.size("--ffn-hidden-size") or (int(4 * h * 2 / 3 / 64) * 64 if gated else 4 * h)
    mla = a.has("--multi-latent-attention")
    kv = a.require("--num-query-groups") if a.has("--group-query-attention") and not mla else heads
    seq = a.require("--seq-length")
    pos = a.text("--position-embedding-type", "learned_absolute")
    if pos not in _POSITION_TYPES:  # an unknown type was costed as rope
        raise AutoparError(f"{a.source}: --position-embedding-type={pos!r}: allowed {', '.join(_POSITION_TYPES)}")
    if a.has("--use-rotary-position-embeddings"):  # Megatron-LM arguments.py validate_args, "Legacy RoPE
        pos = "rope"  # arguments": it sets position_embedding_type = 'rope' whatever the type flag says
    norm = a.text("--normalization", "RMSNorm" if a.has("--use-fused-rmsnorm") else "LayerNorm")
    if norm not in ("RMSNorm", "LayerNorm"):
        raise AutoparError(f"{a.source}: --normalization={norm!r}: allowed RMSNorm, LayerNorm")
    num_layers = a.require("--num-layers")
    fields: dict[str, Any] = dict(
        name=path.stem, num_layers=num_layers, hidden_size=h, num_attention_heads=heads, num_kv_heads=kv,
        head_dim=a.integer("--kv-channels", h // heads), ffn_hidden_size=ffn,
        max_position_embeddings=a.size("--max-position-embeddings", seq),
        tie_word_embeddings=not a.has("--untie-embeddings-and-output-weights"), gated_mlp=gated,
        norm=norm.lower(), qkv_bias=a.has("--add-qkv-bias"), linear_bias=not a.has("--disable-bias-linear"),
        qk_norm=a.has("--qk-layernorm"), position_embedding="learned" if pos == "learned_absolute" else "rope",
        **dropout_fields(a),
        mtp_num_layers=a.integer("--mtp-num-layers", 0),
        # Megatron's --rotary-base / --norm-epsilon, kept so an export from --script writes them back
        rope_theta=a.number("--rotary-base", 0.0) if a.has("--rotary-base") else None,
        norm_eps=a.number("--norm-epsilon", 0.0) if a.has("--norm-epsilon") else None,
    )
    fields.update(_moe_fields(a, num_layers, ffn))
    fields.update(attention_fields(a, num_layers))
    if mla:
        fields.update(mla=True, q_lora_rank=a.integer("--q-lora-rank", 0), kv_lora_rank=a.integer("--kv-lora-rank", 32),
                      qk_nope_head_dim=a.integer("--qk-head-dim", 128),
                      qk_rope_head_dim=a.integer("--qk-pos-emb-head-dim", 64), v_head_dim=a.integer("--v-head-dim", 128))
    vocab, error = vocab_size(a, path)
    if vocab is not None:
        fields["vocab_size"] = vocab
    return fields, error


def _moe_fields(a: Args, num_layers: int, ffn: int) -> dict[str, Any]:
    experts = a.integer("--num-experts", 0)
    if not experts:
        return {}
    moe_ffn = a.size("--moe-ffn-hidden-size") or a.size("--moe-intermediate-size") or ffn
    shared = a.integer("--moe-shared-expert-intermediate-size")
    if shared is None:
        shared = a.integer("--n-shared-experts", 0) * moe_ffn
    return dict(num_experts=experts, num_experts_per_tok=a.integer("--moe-router-topk", 2), moe_ffn_hidden_size=moe_ffn,
                shared_expert_ffn_hidden_size=shared, moe_layers=moe_layers(a, num_layers),
                router_bias=a.has("--moe-router-enable-expert-bias"),
                router_sigmoid=a.text("--moe-router-score-function", "softmax") == "sigmoid"
                and not a.has("--moe-router-enable-expert-bias"),
                router_aux_loss_coeff=a.number("--moe-aux-loss-coeff", 0.0),
                router_num_groups=a.integer("--moe-router-num-groups", 0),
                router_group_topk=a.integer("--moe-router-group-topk", 0),
                router_topk_scaling_factor=a.number("--moe-router-topk-scaling-factor", 0.0)
                if a.has("--moe-router-topk-scaling-factor") else None)


def moe_layers(a: Args, num_layers: int) -> tuple[int, ...]:
    """Indices of MoE layers: ``--moe-layer-freq`` N (every N-th layer from 0) or a list
    expression such as ``([0]*3+[1]*58)`` (Megatron ``moe_layer_freq``), after MindSpeed's
    ``--first-k-dense-replace K`` (first K layers dense).

    Raises:
        AutoparError: a pattern whose length is not num_layers, a frequency below 1, or an
            unreadable expression.
    """
    freq = a.text("--moe-layer-freq", "1")
    pattern = a.frequency("--moe-layer-freq", freq, "([0]*3+[1]*58)")
    if isinstance(pattern, int):
        pattern = [1 if i % pattern == 0 else 0 for i in range(num_layers)]
    if len(pattern) != num_layers:
        raise AutoparError(f"{a.source}: --moe-layer-freq={freq!r} gives {len(pattern)} layers, "
                           f"--num-layers is {num_layers}")
    if any(flag not in (0, 1) or isinstance(flag, bool) for flag in pattern):  # Megatron: 1 = MoE, 0 = dense
        raise AutoparError(f"{a.source}: --moe-layer-freq={freq!r}: a list's entries must be 0 (dense) or 1 (MoE)")
    dense = a.integer("--first-k-dense-replace", 0)
    return tuple(i for i, moe in enumerate(pattern) if moe and i >= dense)


def layout_fields(a: Args, num_layers: int) -> dict[str, Any]:
    """Strategy fields (all but dp) from the parallel, batch and recompute flags.

    Rules: ecosystem.md 1.3 (SP is switched off at tp=1; VPP from layers per virtual stage;
    uneven first/last stages; recompute as Megatron-LM reads it: :mod:`autopar.specs.script_recompute`;
    ``--account-for-embedding/loss-in-pipeline-split`` add one layer each to the count VPP is
    derived from, and cannot be combined with the first/last stage counts, rule 22).

    Raises:
        AutoparError: a size flag below 1, a VPP layer count that does not divide the stage, an
            unknown sharding strategy or recompute method, the embedding/loss flags with
            first/last stage counts, both VPP flags (rule 17), layers per virtual stage with
            first/last stage counts (rule 18), ``--pipeline-model-parallel-layout`` beside another split flag (:func:`pipeline_layout_flag`).
    """
    size = a.size
    tp, pp = size("--tensor-model-parallel-size", 1), size("--pipeline-model-parallel-size", 1)
    vpp = size("--num-virtual-stages-per-pipeline-rank", None)
    per_vstage = size("--num-layers-per-virtual-pipeline-stage", None)
    embedding = a.has("--account-for-embedding-in-pipeline-split")
    loss = a.has("--account-for-loss-in-pipeline-split")
    accounted = num_layers + embedding + loss  # ecosystem.md 1.3 rule 21: L' = L (+1) (+1)
    layout_text = None
    if a.has("--pipeline-model-parallel-layout"):
        layout_text, vpp = pipeline_layout_flag(a, pp, vpp, per_vstage, embedding or loss)
    if vpp is not None and per_vstage is not None:
        raise AutoparError(f"{a.source}: --num-virtual-stages-per-pipeline-rank={vpp} with "
                           f"--num-layers-per-virtual-pipeline-stage={per_vstage}: Megatron-LM accepts at most one")
    if vpp is None and per_vstage:
        if accounted % (pp * per_vstage):
            raise AutoparError(f"{a.source}: --num-layers-per-virtual-pipeline-stage={per_vstage} does not divide "
                               f"num_layers/pp = {accounted}/{pp}"
                               + (" (embedding/loss counted as layers)" if accounted != num_layers else ""))
        vpp = accounted // (pp * per_vstage)
    if (embedding or loss) and (a.has("--decoder-first-pipeline-num-layers")
                                or a.has("--decoder-last-pipeline-num-layers")):
        raise AutoparError(f"{a.source}: --account-for-embedding/loss-in-pipeline-split cannot be combined with "
                           "--decoder-first/last-pipeline-num-layers (Megatron-LM: one or the other)")
    if per_vstage is not None and (a.has("--decoder-first-pipeline-num-layers")
                                   or a.has("--decoder-last-pipeline-num-layers")):
        raise AutoparError(f"{a.source}: --num-layers-per-virtual-pipeline-stage={per_vstage} with "
                           "--decoder-first/last-pipeline-num-layers: Megatron-LM needs "
                           "--num-virtual-stages-per-pipeline-rank for an uneven split")
    if layout_text is None:
        even_split_check(a, num_layers, pp, vpp or 1, accounted)
    zero = 1 if a.has("--use-distributed-optimizer") else 0
    if a.has("--use-megatron-fsdp"):
        name = a.text("--data-parallel-sharding-strategy", "optim_grads_params")
        if name not in _FSDP_ZERO:
            raise AutoparError(f"{a.source}: --data-parallel-sharding-strategy={name!r}: allowed {', '.join(_FSDP_ZERO)}")
        zero = _FSDP_ZERO[name]
    elif a.has("--use-torch-fsdp2"):
        zero = 3
    ep = size("--expert-model-parallel-size", 1)
    etp = size("--expert-tensor-parallel-size", tp)
    return dict(tp=tp, pp=pp, vpp=vpp or 1, cp=size("--context-parallel-size", 1), ep=ep, etp=etp,
                mbs=size("--micro-batch-size", 1), sp=a.has("--sequence-parallel") and tp > 1, zero=zero,
                **recompute_fields(a),
                layers_per_stage=None if layout_text else stage_split(a, num_layers, pp),
                account_for_embedding=embedding, account_for_loss=loss, pipeline_layout=layout_text)


def pipeline_layout_flag(a: Args, pp: int, vpp: int | None, per_vstage: int | None,
                         accounted: bool) -> tuple[str, int]:
    """``--pipeline-model-parallel-layout``: the layout string (normalised,
    :meth:`~autopar.pipeline.layout.PipelineLayout.megatron`) and the vpp it sets.

    Raises:
        AutoparError: a string Megatron-LM cannot parse, a stage count pp does not divide, or the
            flags Megatron-LM refuses beside it (arguments.py: at most one of it,
            ``--num-layers-per-virtual-pipeline-stage`` and ``--num-virtual-stages-per-pipeline-rank``;
            TransformerConfig: not with the first/last stage counts or the account flags).
    """
    from autopar.pipeline.layout import PipelineLayout

    flag = "--pipeline-model-parallel-layout"
    text = a.text(flag) or ""
    others = [f for f in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                          "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                          "--num-layer-list") if a.has(f)]
    if accounted:
        others.append("--account-for-embedding/loss-in-pipeline-split")
    if others:
        raise AutoparError(f"{a.source}: {flag}={text!r} with {', '.join(others)}: Megatron-LM takes the layout alone "
                           "('pipeline_model_parallel_layout cannot be set with other pipeline layout arguments')")
    layout = PipelineLayout.parse(text, pp, f"{a.source}: {flag}")
    return layout.megatron(), layout.vpp


def even_split_check(a: Args, num_layers: int, pp: int, vpp: int, accounted: int) -> None:
    """Megatron-LM's even pipeline split: without ``--decoder-first/last-pipeline-num-layers`` (or
    MindSpeed's ``--num-layer-list``, or a layout string) the ``accounted`` layers (``--num-layers``
    plus one for each ``--account-for-embedding/loss-in-pipeline-split``) must divide by pp.
    ``megatron/training/arguments.py`` ``validate_args`` asserts "Number of layers should be
    divisible by the pipeline-model-parallel size"; with virtual stages
    ``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build`` asserts the same.
    A script is costed as it runs, so autopar does not choose an uneven split for it (a flexible
    split stays for the layouts autopar plans).

    Raises:
        AutoparError: the split does not divide, naming the flags that would make it run with the
            script's ``vpp`` virtual stages (:func:`_first_last_counts`).
    """
    if pp == 1 or accounted % pp == 0 or any(a.has(f) for f in (
            "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--num-layer-list",
            "--noop-layers")):  # MindSpeed's noop layers: autopar.specs.script_layers checks their split
        return
    options = []
    if accounted == num_layers and (num_layers + 1) % (pp * vpp) == 0:
        options.append("--account-for-embedding-in-pipeline-split (or --account-for-loss-in-pipeline-split)")
    if accounted < num_layers + 2 and (num_layers + 2) % (pp * vpp) == 0:
        options.append("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split")
    counts = _first_last_counts(num_layers, pp, vpp)
    if accounted == num_layers and counts:  # Megatron refuses the first/last counts beside the account flags
        options.append(f"--decoder-first-pipeline-num-layers {counts[0]} --decoder-last-pipeline-num-layers "
                       f"{counts[1]}")
    options.append("--pipeline-model-parallel-layout")
    raise AutoparError(f"{a.source}: --num-layers={num_layers}"
                       + (f" (+{accounted - num_layers} for the embedding/loss)" if accounted != num_layers else "")
                       + f" is not divisible by --pipeline-model-parallel-size={pp}: Megatron-LM asserts 'Number of "
                       "layers should be divisible by the pipeline-model-parallel size' (megatron/training/arguments.py)"
                       f"; to run it add {' or '.join(options)}")


def _first_last_counts(num_layers: int, pp: int, vpp: int) -> tuple[int, int] | None:
    """First and last stage counts Megatron-LM runs for ``num_layers`` over ``pp`` stages of ``vpp``
    chunks (``get_num_layers_to_build``: the middle stages share the rest evenly, each stage a
    multiple of vpp), the middle stages near ``num_layers/pp``; None if none is near."""
    middle_stages = pp - 2
    base = num_layers // pp // vpp * vpp
    for middle in sorted(range(max(vpp, base - 2 * vpp), base + 3 * vpp, vpp), key=lambda m: abs(m - num_layers / pp)):
        rest = num_layers - middle * middle_stages
        first = rest // 2 // vpp * vpp
        if rest % vpp == 0 and first >= vpp and rest - first >= vpp:
            return first, rest - first
    return None


def stage_split(a: Args, num_layers: int, pp: int) -> tuple[int, ...] | None:
    """Explicit layers per stage from MindSpeed ``--num-layer-list`` or Megatron's
    ``--decoder-first/last-pipeline-num-layers`` (the middle stages share the rest evenly);
    None for Megatron's even split.

    Raises:
        AutoparError: a list that is not integers, or middle layers that do not divide evenly.
    """
    if a.has("--num-layer-list"):
        text = a.text("--num-layer-list") or ""
        try:
            return tuple(int(x) for x in text.replace(" ", "").split(","))
        except ValueError:
            raise AutoparError(f"{a.source}: --num-layer-list={text!r}: expected integers like 7,9,8,8") from None
    first = a.integer("--decoder-first-pipeline-num-layers")
    last = a.integer("--decoder-last-pipeline-num-layers")
    for flag, value in (("--decoder-first-pipeline-num-layers", first), ("--decoder-last-pipeline-num-layers", last)):
        if value is not None and not 0 <= value <= num_layers:
            raise AutoparError(f"{a.source}: {flag}={value}: must be in 0..num_layers={num_layers}")
    if (first is None and last is None) or pp == 1:
        return None
    middle_stages = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if middle_stages == 0 or rest % middle_stages:
        if middle_stages == 0 and rest == 0:
            return tuple(x for x in (first, last) if x is not None)
        raise AutoparError(f"{a.source}: {rest} middle layers do not split evenly over {middle_stages} stages")
    middle = [rest // middle_stages] * middle_stages
    return tuple(([first] if first is not None else []) + middle + ([last] if last is not None else []))

