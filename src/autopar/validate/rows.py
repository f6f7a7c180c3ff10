"""Published measurements (``autopar/data/validation/measurements.csv``) as autopar problems.

Each CSV row becomes a :class:`Case`: a :class:`~autopar.problem.Problem` (model from the row's
dimensions, :mod:`~autopar.validate.row_model`; cluster from its ``gpu``/``num_gpus``/
``gpus_per_node``; batch and precision), the row's exact :class:`~autopar.strategy.Strategy`, and
the knobs that had to be assumed. Knobs a row leaves empty take the documented default of its
*source family* (:data:`FAMILIES`; a source autopar does not know gets :data:`GENERIC`); such
rows are marked ``assumed``. A row that cannot be mapped raises :class:`Unscorable` with the
reason (naming the CSV column), which the report lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pydantic import ValidationError

from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.specs import TrainSpec, load_device, make_cluster
from autopar.specs.cluster import MAX_NODES, resolve_device_name
from autopar.strategy import Strategy
from autopar.validate.cells import (
    Unscorable,
    expert_tp_of,
    flag_of,
    fp8_recipe_of,
    precision_of,
    recompute_of,
    required,
    zero_of,
)
from autopar.validate.data_parallel import data_parallel_of, fp8_param_gather_of
from autopar.validate.measurements import Row
from autopar.validate.moe_recipes import apply_moe_recipe
from autopar.validate.row_model import model_of
from autopar.validate.row_pipeline import embedding_loss_split, sc21_table1, torchtitan_pipeline
from autopar.validate.ub_recipes import describe, userbuffers_of


@dataclass(frozen=True)
class Family:
    """Defaults for knobs a source leaves unstated, with where they come from.

    ``zero``: 0 plain DDP, 1 distributed optimizer / ZeRO-1, 3 FSDP. ``sp``: None means
    "on when tp > 1". ``flash``/``dropout``: kernels and regularisation of that code base.
    ``tp_overlap``: TP collectives overlapped with GEMMs (TE userbuffers, ``--tp-comm-overlap``).
    ``dp_overlap``: gradient reduction overlapped with backward (``--overlap-grad-reduce``, FSDP).
    ``framework``: ``TrainSpec.framework`` of the code base (a row whose ``zero_or_distopt`` names
    DeepSpeed, e.g. SC'21's ZeRO-3 baseline, runs on DeepSpeed whatever its source).
    ``launch_blocking``: the source's launch scripts set ``CUDA_LAUNCH_BLOCKING=1``.
    ``tp_backward_overlap``: backward TP collectives under the linears' own GEMMs
    (``TrainSpec.tp_backward_overlap``, Megatron-LM's async TP all-reduce, on by default since 2021-09);
    ``tp_backward_why``: why the family has it or not (code date).
    """

    name: str
    zero: int
    recompute: str
    sp: bool | None
    flash: bool
    dropout: bool
    tp_overlap: bool
    dp_overlap: bool
    why: str
    framework: str = "megatron"
    launch_blocking: bool = False
    tp_backward_overlap: bool = True
    tp_backward_why: str = "Megatron-LM after 2021-09: LinearWithGradAccumulationAndAsyncCommunication, on by default"


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("megatron-2020", zero=0, recompute="full", sp=False, flash=False, dropout=True, tp_overlap=False,
           dp_overlap=False, why="Megatron-LM 2020 GPT-2 scripts: --checkpoint-activations, DDP all-reduce "
           "after backward, one micro-batch per replica (mbs = gbs/dp)", tp_backward_overlap=False,
           tp_backward_why="2020 code: synchronous TP all-reduce (async TP all-reduce came 2021-09)"),
    Family("megatron-2021", zero=0, recompute="full", sp=False, flash=False, dropout=True, tp_overlap=False,
           dp_overlap=False, why="Narayanan et al. SC'21: full recompute (eq. 3), DDP without optimizer "
           "sharding or overlap; Table 1 mbs/vpp from Megatron-LM examples/sc21/run_table_1.sh",
           tp_backward_overlap=False, tp_backward_why="SC'21 runs (paper of 2021-04) predate the async TP "
           "all-reduce (2021-09)"),
    Family("megatron-2022", zero=0, recompute="full", sp=False, flash=False, dropout=True, tp_overlap=False,
           dp_overlap=False, why="Korthikanti et al. 2022: layouts as stated in Tables 3-5; no DP overlap (sec. 6.3)"),
    Family("megatron-2024", zero=1, recompute="none", sp=None, flash=True, dropout=False, tp_overlap=True,
           dp_overlap=True, why="Megatron-LM README 2024 (r0.8): --overlap-grad-reduce --overlap-param-gather "
           "(distributed optimizer) --tp-comm-overlap, SP with TP; mbs 1, no interleaving, no recompute assumed"),
    Family("nemo", zero=1, recompute="none", sp=None, flash=True, dropout=False, tp_overlap=True, dp_overlap=True,
           why="NeMo/dgxc-benchmarking recipes: distributed optimizer with overlapped grad reduce and param "
           "gather, SP when tp > 1, TP comm overlap, no recompute; mbs 1 and no interleaving when not stated"),
    Family("megatron-bridge", zero=1, recompute="none", sp=None, flash=True, dropout=False, tp_overlap=True,
           dp_overlap=True, why="Megatron-Bridge performance recipes (25.09/25.11): distributed optimizer with "
           "overlapped grad reduce and param gather, SP with TP, TP comm overlap, no recompute unless the recipe "
           "names modules; MoE knobs per model and GPU in autopar.validate.moe_recipes"),
    Family("torchtitan", zero=3, recompute="selective", sp=None, flash=True, dropout=False, tp_overlap=False,
           dp_overlap=True, framework="torchtitan", why="torchtitan 2024-12 benchmarks: FSDP2 (ZeRO-3, "
           "prefetching, fp32 sharded parameters), per-op selective AC, SDPA flash attention, local batch 2",
           tp_backward_overlap=False, tp_backward_why="DTensor TP collectives are synchronous; AsyncTP rows "
           "map to tp_comm_overlap (tp_overlap_of)"),
    Family("megatron-deepspeed", zero=1, recompute="full", sp=False, flash=False, dropout=False, tp_overlap=False,
           dp_overlap=False, framework="deepspeed", launch_blocking=True, why="BLOOM (Megatron-DeepSpeed): ZeRO-1 "
           "(BF16_Optimizer) reducing after the last backward, full activation checkpointing, no SP, no flash "
           "attention, dropout 0; CUDA_LAUNCH_BLOCKING=1 (tr11-176B-ml.slurm: the hang workaround, also used "
           "for the prequel sweeps, chronicles-prequel.md 'Hanging Issue')", tp_backward_overlap=False,
           tp_backward_why="Megatron-DeepSpeed forked Megatron-LM before the async TP all-reduce; its later "
           "port keeps async_tensor_model_parallel_allreduce off by default (Megatron-DeepSpeed issue #447)"),
)}

#: Defaults for a row whose id names no known source: autopar's own Megatron-LM defaults, the
#: ones ``autopar estimate`` uses (``Strategy``/``TrainSpec``): distributed optimizer, no
#: recompute, SP with TP, fused attention, no dropout, DP gradient reduction overlapped with the
#: backward, TP collectives not overlapped; mbs 1, no interleaving. Every one is marked assumed.
GENERIC = Family("generic", zero=1, recompute="none", sp=None, flash=True, dropout=False, tp_overlap=False,
                 dp_overlap=True, why="source not known: autopar's Megatron-LM defaults (distributed optimizer, "
                 "no recompute, SP with TP, fused attention, no dropout, overlapped grad reduce, no TP comm "
                 "overlap, mbs 1, no interleaving)")

#: Largest global batch scored, the bound ``autopar estimate --gbs`` has (``cli/inputs.py``): the
#: pipeline simulation's work grows with the micro-batch count.
MAX_GBS = 2**30


_FAMILY_BY_PREFIX = (
    ("MLM2020", "megatron-2020"), ("NAR21", "megatron-2021"), ("KOR22", "megatron-2022"),
    ("MLM-H100", "megatron-2024"), ("MLM-LLAMA", "nemo"), ("NEMO", "nemo"), ("DGXC", "nemo"),
    ("AUTOMODEL", "torchtitan"), ("TT2412", "torchtitan"), ("TT2506", "torchtitan"), ("BLOOM", "megatron-deepspeed"),
    ("MBR", "megatron-bridge"),
)

@dataclass
class Case:
    """A row mapped onto autopar: what to estimate and how to read the answer."""

    row: Row
    family: Family
    problem: Problem
    strategy: Strategy
    assumed: list[str] = field(default_factory=list)

    @property
    def precision(self) -> str:
        return self.problem.train.precision


def family_of(row: Row) -> Family:
    """The source family of the row's id prefix (:data:`_FAMILY_BY_PREFIX`), else :data:`GENERIC`."""
    for prefix, name in _FAMILY_BY_PREFIX:
        if row.id.startswith(prefix):
            return FAMILIES[name]
    return GENERIC


def device_of(row: Row):
    """Device preset for the ``gpu`` column (any name :func:`~autopar.specs.cluster.resolve_device_name`
    resolves: "H100-SXM5-80GB (DGX-H100)", "B200 (DGX-B200)"), with cluster facts stated by the
    row's source.

    Raises:
        Unscorable: an empty cell, a V100, or a name that resolves to no preset or to several.
    """
    gpu = row["gpu"]
    if not gpu:
        raise Unscorable("gpu is empty: the device is needed")
    if gpu.startswith("V100"):
        raise Unscorable(f"gpu={gpu!r}: V100 has no bf16 tensor cores and DeviceSpec needs a bf16 peak")
    if gpu.startswith("A100 (DGX-A100"):
        return load_device("a100-40gb")  # 2020 DGX A100 shipped 40 GB parts only (80 GB came Nov 2020)
    if gpu.startswith("A100-SXM4-80GB (Jean Zay)"):
        # Jean Zay A100 nodes: 4 x 100 Gb/s Omni-Path links per 8 GPUs (IDRIS hardware page;
        # BLOOM README and paper, "Hardware"): 50 GB/s per node, 6.25 GB/s per GPU per direction.
        # NCCL has no Omni-Path (PSM2) transport: it runs its IB-verbs transport on the hfi1
        # verbs provider, host-staged (no GPUDirect RDMA on OPA verbs), which moves about 3.76 of
        # the 12.5 GB/s line rate for >= 1 MB messages (osu_put_bw over verbs vs 12.3 GB/s over
        # PSM2 between two OPA 100 Gb/s nodes, openucx/ucx issue #3196): efficiency 0.30.
        return load_device("a100-80gb", overrides=["inter_node_bandwidth_bytes_per_s=6.25e9",
                                                   "inter_node_comm_efficiency=0.30"])
    try:
        return load_device(resolve_device_name(gpu, "gpu"))
    except AutoparError as err:  # unknown or ambiguous name: the message names the gpu cell
        raise Unscorable(str(err)) from None


@dataclass(frozen=True)
class Recipe:
    """Knobs a benchmark's own launch recipe sets for some of its rows, where the rows leave them
    unstated and they differ from the source family's default (more specific than a
    :class:`Family`). ``None`` keeps the family's value."""

    name: str
    applies: Callable[[Row], bool]
    recompute: str | None = None
    flash: bool | None = None
    recompute_modules: tuple[str, ...] = ("core_attn",)
    dropout: bool | None = None


RECIPES: tuple[Recipe, ...] = (
    # NeMo's GPT-3 configs train with dropout: dgxc-benchmarking v24.11.1
    # nemo_megatron/gpt3_175b_hydra.yaml (hidden_dropout 0.1, attention_dropout 0.1) and
    # NeMo-Framework-Launcher conf/training/gpt3/*.yaml (hidden_dropout 0.1; attention_dropout
    # NeMo's default 0.1), which NeMo 24.07's performance summary runs; the Llama and Nemotron
    # configs set both to 0.0.
    Recipe("NeMo GPT-3 configs: hidden and attention dropout 0.1",
           lambda row: row.id.startswith(("DGXC", "NEMO")) and row["model"].lower().startswith("gpt3"),
           dropout=True),
    # dgxc-benchmarking v24.11.1 nemotron/nemotron4-340b-synth.yaml (NeMo 24.09):
    # activations_checkpoint_granularity: selective, which nemotron/configure.sh does not override
    # for 340b (it sets tp 8, pp 8, vp 12, mbs 1, SP and ub_tp_comm_overlap): Megatron-Core's
    # selective recompute of the core attention. The 15b config sets it to null.
    Recipe("dgxc 24.11 nemotron4-340b-synth.yaml: activations_checkpoint_granularity selective",
           lambda row: row.id.startswith("DGXC2411") and row["model"].lower().startswith("nemotron4-340b"),
           recompute="selective"),
    # dgxc-benchmarking deepseek_v3/pretraining/launch.sh (v25.05.04), NeMo 25.04 on GB200:
    # --recompute_modules core_attn (Megatron's selective recompute of the core attention), and
    # no fused attention for MLA: head_dim_qk 192 differs from head_dim_v 128, which
    # FlashAttention-2 refuses (TransformerEngine's backend selection: "Supported: head_dim_qk =
    # head_dim_v", TE issue #3006 log) and cuDNN fused attention serves on Blackwell only from
    # cuDNN 9.11 (Megatron-LM DeepSeek-V3 GB200 guide, baseline item 2), newer than the 25.04
    # container's, so TE falls back to its unfused attention - which is why the recipe recomputes
    # core_attn.
    Recipe("dgxc DeepSeek-V3 GB200 launch.sh: core_attn; no MLA kernel on Blackwell before cuDNN 9.11",
           lambda row: row.id.startswith("DGXC") and row["model"].lower().startswith("deepseek")
           and row["gpu"].startswith("GB200"),
           recompute="selective", flash=False),
    # The same launch.sh on H100 (512 and 1024 GPUs): --recompute_modules mla_up_proj, with
    # NeMo's pretrain_deepseek_v3.py setting recompute_granularity='selective'; without it the
    # layout needs about 100 GB per GPU (autopar's memory model), above the 80 GB of an H100.
    Recipe("dgxc DeepSeek-V3 H100 launch.sh: selective recompute of mla_up_proj",
           lambda row: row.id.startswith("DGXC") and row["model"].lower().startswith("deepseek")
           and row["gpu"].startswith("H100"),
           recompute="selective", recompute_modules=("mla_up_proj",)),
)


def recipe_of(row: Row) -> Recipe | None:
    """The first :data:`RECIPES` entry that applies to ``row``, else None."""
    return next((r for r in RECIPES if r.applies(row)), None)


def strategy_of(row: Row, family: Family, num_layers: int, assumed: list[str], mtp_num_layers: int = 0) -> Strategy:
    """The row's layout; unstated knobs from the family (recorded in ``assumed``).

    ``dp`` is ``num_gpus / (tp * pp * cp)`` when the row leaves it empty; ``mbs`` is
    ``gbs / dp`` for the families that run one micro-batch per replica (megatron-2020,
    torchtitan without pp), else 1; SC'21 Table 1 rows take mbs and vpp from the paper's script
    (:data:`autopar.validate.row_pipeline.SC21_TABLE1`) where it lists the layer count and its chunking splits the layers.

    Raises:
        Unscorable: tp, pp, gbs or num_gpus empty; num_gpus not a multiple of tp*pp*cp or gbs
            not a multiple of dp where they are derived; a cell :mod:`~autopar.validate.cells`
            refuses; a value the layout cannot take (named by CSV column).
    """
    for column in ("tp", "pp"):
        if row.int(column) is None:
            raise Unscorable(f"parallel layout not stated: {column} is empty")
    tp, pp = row.int("tp"), row.int("pp")
    cp = row.int("cp") or 1
    gpus, gbs = required(row, "num_gpus", "the cluster size is needed"), required(row, "gbs", "the batch is needed")
    if gbs > MAX_GBS:
        raise Unscorable(f"gbs={gbs}: expected at most {MAX_GBS} (the bound of autopar's --gbs)")
    dp = row.int("dp")
    if dp is None:
        if gpus % (tp * pp * cp):
            raise Unscorable(f"num_gpus={gpus} is not a multiple of tp*pp*cp = {tp}*{pp}*{cp} (dp is derived as "
                             "num_gpus / (tp*pp*cp) when the dp column is empty)")
        dp = gpus // (tp * pp * cp)
    mbs, vpp = row.int("mbs"), row.int("vpp")
    if pp * (vpp or 1) > num_layers + 2:  # before any per-stage tuple is built
        raise Unscorable(f"pp={pp} x vpp={vpp or 1} model chunks: more than the {num_layers} layers (+ embedding "
                         "and loss) can fill")
    if family.name == "megatron-2021" and row.id.startswith("NAR21-T1"):
        mbs, vpp = sc21_table1(num_layers, pp, mbs, vpp, assumed)
    split: dict = {}
    per_replica = family.name in ("megatron-2020", "torchtitan")
    if per_replica and gbs % dp and (mbs is None or family.name == "torchtitan" and pp > 1):
        raise Unscorable(f"gbs={gbs} is not a multiple of dp={dp} ({family.name} runs gbs / dp sequences per "
                         "replica; state mbs or a batch that splits)")
    if family.name == "torchtitan" and pp > 1:
        mbs, vpp, split = torchtitan_pipeline(row, gbs // dp, pp, mbs, vpp, assumed, mtp_num_layers)
    if mbs is None:
        mbs = gbs // dp if per_replica else 1
        assumed.append(f"mbs={mbs}")
    if vpp is None:
        vpp = 1
        if pp > 1:
            assumed.append("vpp=1")
    if family.name != "torchtitan":
        split = split or embedding_loss_split(num_layers, pp, vpp, assumed)
    sp = flag_of(row, "sp")
    if sp is None:
        sp = tp > 1 if family.sp is None else family.sp and tp > 1
        if tp > 1:
            assumed.append(f"sp={'on' if sp else 'off'}")
    zero = zero_of(row)
    if zero is None:
        zero = family.zero
        if zero:
            assumed.append(f"zero={zero}")
    try:
        return Strategy(
            dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=row.int("ep") or 1, etp=expert_tp_of(row), mbs=mbs, sp=sp,
            zero=zero, recompute=_recompute(row, family, assumed), recompute_modules=recompute_modules_of(row),
            schedule="interleaved" if vpp > 1 else "1f1b", **split,
        )
    except ValidationError as err:  # a derived size beyond the layout's bounds (the CSV's are checked on reading)
        raise Unscorable("layout invalid: " + "; ".join(f"{'.'.join(map(str, e['loc']))}={e.get('input')!r}: {e['msg']}"
                                                         for e in err.errors())) from None


def _recompute(row: Row, family: Family, assumed: list[str]) -> str:
    """The ``recompute`` cell (:func:`~autopar.validate.cells.recompute_of`), else the row's
    :class:`Recipe`'s, else the family's; the last two recorded in ``assumed``."""
    stated = recompute_of(row, assumed)
    if stated is not None:
        return stated
    recipe = recipe_of(row)
    if recipe is not None and recipe.recompute is not None:
        assumed.append(f"recompute={recipe.recompute} ({recipe.name})")
        return recipe.recompute
    assumed.append(f"recompute={family.recompute}")
    return family.recompute


def recompute_modules_of(row: Row) -> tuple[str, ...]:
    """What selective recompute re-runs: the row's :class:`Recipe` modules, else Megatron's
    default ``core_attn``."""
    recipe = recipe_of(row)
    return ("core_attn",) if recipe is None else recipe.recompute_modules


def dropout_of(row: Row, family: Family, assumed: list[str]) -> bool:
    """Dropout during training: the row's :class:`Recipe` value where one sets it (recorded in
    ``assumed``), else the family's default."""
    recipe = recipe_of(row)
    if recipe is None or recipe.dropout is None:
        return family.dropout
    assumed.append(f"dropout={'on' if recipe.dropout else 'off'} ({recipe.name})")
    return recipe.dropout


def flash_of(row: Row, family: Family) -> bool:
    """Fused (flash) attention: the row's :class:`Recipe` value where one sets it, else the
    family's default."""
    recipe = recipe_of(row)
    return family.flash if recipe is None or recipe.flash is None else recipe.flash


def tp_overlap_of(row: Row, family: Family) -> bool:
    """TP collectives overlapped with their GEMMs: the family default, or a row that names
    torchtitan's AsyncTP (``enable_async_tensor_parallel``: micro-pipelined all-gather/reduce-scatter
    matmuls, as Transformer Engine userbuffers), written ``AsyncTP`` or ``async TP``. NeMo 24.07 rows keep
    the nemo family's overlap although NeMo-Framework-Launcher 24.07 ``conf/training/gpt3/175b.yaml`` and
    ``nemotron/nemotron_340b.yaml`` say ``ub_tp_comm_overlap: False``: the table's layouts are not those
    configs' (vp 6 and pp 8 x vp 12 against vp 12 and pp 12 x vp 8), and the launcher's commit 630e6544
    (2024-12) moved nemotron_340b to the table's layout with ``ub_tp_comm_overlap: True``; dgxc 24.11.1
    runs both models with it on."""
    return family.tp_overlap or "asynctp" in row["notes"].lower().replace(" ", "")


def tp_backward_overlap_of(row: Row, family: Family) -> bool:
    """Backward TP collectives under their GEMMs (``TrainSpec.tp_backward_overlap``): the family's
    (:attr:`Family.tp_backward_why`), off for a row run on DeepSpeed (its Megatron fork, e.g.
    SC'21's ZeRO-3 baseline)."""
    return family.tp_backward_overlap and framework_of(row, family) != "deepspeed"


def framework_of(row: Row, family: Family) -> str:
    """``TrainSpec.framework`` of the run: DeepSpeed when the row says so, else the family's."""
    return "deepspeed" if "deepspeed" in row["zero_or_distopt"].lower() else family.framework


def to_case(row: Row) -> Case:
    """Map one row (model, layout, cluster, training settings).

    Raises:
        Unscorable: the reason the row cannot be scored, naming the CSV column and value.
    """
    family = family_of(row)
    assumed: list[str] = []
    if family is GENERIC:
        assumed.append("source unknown: generic defaults (Megatron-LM, fused attention, no dropout, overlapped grad "
                       "reduce, no TP comm overlap)")
    model = model_of(row, dropout_of(row, family, assumed), assumed)
    strategy = strategy_of(row, family, model.num_layers, assumed, model.mtp_num_layers)
    # TP overlap is a layout knob that needs SP with tp > 1 (rule tp_comm_overlap_needs_sp).
    overlap = tp_overlap_of(row, family) and strategy.sp and strategy.tp > 1
    strategy = strategy.model_copy(update={"tp_comm_overlap": overlap})
    device = device_of(row)
    gpus = required(row, "num_gpus", "the cluster size is needed")
    per_node = row.int("gpus_per_node") or device.default_devices_per_node
    if per_node > 1024:
        raise Unscorable(f"gpus_per_node={per_node}: expected at most 1024")
    if gpus < per_node:
        per_node = gpus  # part of one node (single-node runs on 1, 2 or 4 GPUs)
    if gpus % per_node:
        raise Unscorable(f"num_gpus={gpus} is not a whole number of {per_node}-GPU nodes (gpus_per_node)")
    if gpus // per_node > MAX_NODES:
        raise Unscorable(f"num_gpus={gpus}: {gpus // per_node} nodes of {per_node}; at most {MAX_NODES} nodes")
    cluster = make_cluster(device, gpus // per_node, per_node)
    flash = flash_of(row, family)
    if flash != family.flash:
        assumed.append(f"{'fused' if flash else 'unfused'} attention ({recipe_of(row).name})")
    precision = precision_of(row, assumed)
    overlap_grad_reduce, grad_dtype = data_parallel_of(row, family, model.num_layers, model.hidden_size, assumed)
    train = TrainSpec(global_batch_size=row.int("gbs"), seq_len=required(row, "seq_len", "the batch is needed"),
                      precision=precision, fp8_recipe=fp8_recipe_of(row, precision), flash_attention=flash,
                      overlap_grad_reduce=overlap_grad_reduce, grad_dtype=grad_dtype,
                      fp8_param_storage=fp8_param_gather_of(row, precision, assumed),
                      framework=framework_of(row, family), tp_backward_overlap=tp_backward_overlap_of(row, family),
                      launch_blocking=family.launch_blocking,
                      # torchtitan 2024-12 and 2025-06 (the TT rows) named the converter "float8", so their apply_tp
                      # took torchao's float8 TP styles (autopar.cost.float8_tp); 0.2.2 no longer does
                      float8_tp_gather=family.name == "torchtitan")
    if model.is_moe:
        strategy, train = apply_moe_recipe(row, strategy, train, assumed)
    if strategy.tp_comm_overlap and train.framework == "megatron":
        ub, source = userbuffers_of(row)
        train = train.model_copy(update={"userbuffers": ub})
        assumed.append(f"TE userbuffers ({source}): {describe(ub)}")
    return Case(row, family, Problem(model, cluster, train), strategy, assumed)
