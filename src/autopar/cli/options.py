"""The command-line option types the commands share (typer ``Annotated`` declarations).

One declaration per option, so ``search``, ``estimate``, ``export``, ``balance``, ``verify`` and
``profile`` spell each option, its help and its default note the same way. ``None`` defaults mean
"the launch script's value, else the default the help text names" (:mod:`autopar.specs.script_cli`).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from autopar.specs import device_names

# Options shared by every command that needs a problem (model, cluster, batch).
Model = Annotated[Optional[str], typer.Option("--model", "-m", help="HF config.json path or preset name (e.g. "
                                                   "llama3-70b, deepseek-v3; all presets: docs/reference/notes.md)")]
Script = Annotated[Optional[str], typer.Option("--script", help="Megatron-LM/MindSpeed-LLM launch script: model, batch, "
                                               "cluster and layout as defaults (options given here win)")]
VocabSize = Annotated[Optional[int], typer.Option("--vocab-size", help="vocabulary size: replaces the model's "
                                                  "(required when --script's tokenizer does not say)")]
Device = Annotated[Optional[str], typer.Option(help=f"device preset: {', '.join(device_names())}; or a name such "
                                               "as 'H100-SXM5-80GB', 'B200 (DGX-B200)', 'MI300X', 'Atlas 800T A2'")]
Nodes = Annotated[Optional[int], typer.Option(help="number of nodes [default: script's, else 1]")]
PerNode = Annotated[Optional[int], typer.Option("--devices-per-node", help="devices per node (default: the device's)")]
Gbs = Annotated[Optional[int], typer.Option("--gbs", help="global batch size (sequences per step) [default: 1024]")]
SeqLen = Annotated[Optional[int], typer.Option("--seq-len", help="sequence length (tokens) [default: 4096]")]
Precision = Annotated[Optional[str], typer.Option(help="bf16 | fp16 | fp8 [default: bf16]")]
DeviceFile = Annotated[Optional[str], typer.Option(help="YAML/JSON with device fields (and optional 'base: <preset>')")]
DeviceSet = Annotated[Optional[list[str]], typer.Option(help="override a device field, KEY=VALUE (repeatable)")]
Flash = Annotated[Optional[bool], typer.Option("--flash-attention/--no-flash-attention",
                                                help="fused attention (no s^2 memory) [default: on]")]
VocabPad = Annotated[Optional[int], typer.Option("--make-vocab-size-divisible-by",
                                                 help="Megatron vocab padding unit [default: 128]")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON document instead of tables")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="no progress display (it shows on stderr, only when stdout and stderr are both a terminal)")]
MoeImbalance = Annotated[Optional[float], typer.Option(
    "--moe-token-imbalance", help="routed token copies on the busiest expert rank over the balanced share, >= 1 "
    "(capacity factor C with --moe-expert-capacity-factor C and padding) [default: 1.0]")]
Fp8ParamStorage = Annotated[Optional[bool], typer.Option(
    "--fp8-param-storage/--no-fp8-param-storage", help="with --precision fp8: keep linear weights only in fp8 "
    "and all-gather them in fp8, 1 B each (Megatron --fp8-param-gather) [default: off]")]
Fp8Recipe = Annotated[Optional[str], typer.Option(
    "--fp8-recipe", help="with --precision fp8: delayed | tensorwise | blockwise | mxfp8 (Blackwell, MI355X) | nvfp4 "
    "(Blackwell; fp4 linear layers) (Megatron --fp8-recipe / --fp4-recipe) [default: the script's, else the "
    "framework's own: delayed, tensorwise for torchtitan]")]
RecomputeModules = Annotated[Optional[str], typer.Option(
    "--recompute-modules", help="what selective recompute re-runs (Megatron --recompute-modules), comma-separated: "
    "core_attn, layernorm, mla_up_proj, moe_act, mlp, moe, shared_experts [default: core_attn; search without it "
    "also tries core_attn,layernorm,mla_up_proj,moe_act on MLA/MoE models for --target megatron]")]
Margin = Annotated[float, typer.Option(help="memory margin: above (1-margin) x device memory is 'marginal'")]
ProfileDb = Annotated[Optional[str], typer.Option(help="SQLite profile DB: measured operator and layer times and "
                                                 "collective fits override the model")]
ProfileDevice = Annotated[Optional[str], typer.Option(help="device name inside --profile-db (default: its only one, "
                                                      "else the one measured on the planned --device)")]
ProfileStandsFor = Annotated[Optional[str], typer.Option(
    "--profile-stands-for", help="trust --profile-db's times, measured on another device, as this planned --device's "
    "(give its name, e.g. h100-80gb); without it such a database is refused")]


# Layout options of ``estimate`` and ``export`` (None = the script's value, else the default shown).
Tp = Annotated[Optional[int], typer.Option("--tp", help="tensor parallel [default: 1]")]
Pp = Annotated[Optional[int], typer.Option("--pp", help="pipeline stages [default: 1]")]
Dp = Annotated[Optional[int], typer.Option("--dp", help="default: world/(tp*pp*cp)")]
Cp = Annotated[Optional[int], typer.Option("--cp", help="context parallel [default: 1]")]
Vpp = Annotated[Optional[int], typer.Option("--vpp", help="virtual stages per pipeline rank [default: 1]")]
Ep = Annotated[Optional[int], typer.Option("--ep", help="expert parallel [default: 1]")]
Etp = Annotated[Optional[int], typer.Option("--etp", help="expert TP (default: tp)")]
Mbs = Annotated[Optional[int], typer.Option("--mbs", help="micro-batch size [default: 1]")]
Zero = Annotated[Optional[int], typer.Option("--zero", help="0-3; 1 = Megatron distributed optimizer [default: 1] "
                                                "(export --format torchtitan: 3, FSDP2)")]
Sp = Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="Megatron sequence parallelism [default: on with "
                                            "tp > 1; export --format deepspeed: off, as Megatron-DeepSpeed's recipes]")]
TpCommOverlap = Annotated[Optional[bool], typer.Option(
    "--tp-comm-overlap/--no-tp-comm-overlap",
    help="TP collectives overlapped with their GEMMs, needs SP: Megatron --tp-comm-overlap (TE userbuffers), "
    "torchtitan async TP, MindSpeed --use-ascend-mc2 [default: on with SP for megatron (Megatron-Bridge "
    "recipes); off for the other formats]")]
MoeDispatcherOpt = Annotated[Optional[str], typer.Option(
    "--moe-dispatcher", help="MoE token dispatcher: alltoall | allgather | deepep | hybridep (Megatron "
    "--moe-token-dispatcher-type, flex with --moe-flex-dispatcher-backend) [default: alltoall]")]
MoeEpOverlap = Annotated[Optional[bool], typer.Option(
    "--moe-ep-overlap/--no-moe-ep-overlap", help="EP all-to-all overlapped with another micro-batch's compute "
    "(Megatron --overlap-moe-expert-parallel-comm; needs ep > 1, and vpp with pp > 1) [default: off]")]
CpCommType = Annotated[Optional[str], typer.Option(
    "--cp-comm-type", help="context-parallel algorithm: p2p (ring) | a2a (Ulysses) | allgather | a2a+p2p "
    "(with --cp-a2a) [default: p2p]")]
CpA2a = Annotated[Optional[int], typer.Option(
    "--cp-a2a", help="a2a+p2p: ranks of the all-to-all group inside cp (Megatron "
    "--hierarchical-context-parallel-sizes A P, MindSpeed --ulysses-degree-in-cp)")]
RecomputeOpt = Annotated[Optional[str], typer.Option("--recompute", help="none | selective | full [default: none]")]
RecomputeLayers = Annotated[Optional[int], typer.Option("--recompute-layers", help="full recompute: layers per chunk")]
ScheduleOpt = Annotated[Optional[str], typer.Option("--schedule", help="1f1b | interleaved | gpipe (Galvatron's "
                                                    "pipeline_type gpipe) | zbv | dualpipev (torchtitan's ZB-V / "
                                                    "DualPipeV, vpp 2) (default from vpp)")]
VocabTp = Annotated[Optional[int], typer.Option(
    "--vocab-tp", help="tensor-parallel degree of the embedding and output layer, Galvatron's vtp [default: tp]")]
VocabSp = Annotated[Optional[bool], typer.Option(
    "--vocab-sp/--no-vocab-sp", help="the embedding and output layer split the sequence over --vocab-tp ranks "
    "(Ulysses), Galvatron's vsp [default: off]")]
TpConsecutive = Annotated[Optional[bool], typer.Option(
    "--tp-consecutive/--no-tp-consecutive", help="TP groups on consecutive ranks; --no-tp-consecutive strides them "
    "over the data-parallel ranks (Galvatron's tp_consecutive_flags 0; needs cp 1) [default: on]")]
LayersPerStage = Annotated[Optional[str], typer.Option("--layers-per-stage", help="explicit split, e.g. 7,8,8,7")]
RecomputePerStage = Annotated[Optional[str], typer.Option(
    "--recompute-per-stage", help="recompute option of each stage, e.g. full,selective,none,none")]
PipelineLayoutOpt = Annotated[Optional[str], typer.Option(
    "--pipeline-layout", help="Megatron-LM --pipeline-model-parallel-layout string: embedding E, decoder layers t, "
    "MTP layers m and loss L of each virtual stage, | between stages, (...)*n repeats, e.g. "
    "\"Et|(tt|)*30mL\"; sets vpp (stages / pp); replaces --layers-per-stage and --embedding-loss-split")]
EmbeddingLoss = Annotated[Optional[bool], typer.Option(
    "--embedding-loss-split/--no-embedding-loss-split",
    help="count the embedding and the loss as one layer each in the pipeline split (Megatron "
    "--account-for-embedding/loss-in-pipeline-split; e.g. 126 layers pp 8 vpp 8; needs --pp 2 or more) "
    "[default: off]")]
# Recipe knobs that are TrainSpec fields (autopar.cli.knob_options); None = the script's, else the default shown.
CudaGraphImpl = Annotated[Optional[str], typer.Option(
    "--cuda-graph-impl", help="CUDA graph capture of training (Megatron-LM --cuda-graph-impl): none | local (Megatron's "
    "CudaGraphManager: whole layers, or the whole step with --cuda-graph-scope full_iteration) | transformer_engine "
    "(TE make_graphed_callables per layer or --cuda-graph-scope part); host launch time removed, static buffers "
    "added; Megatron-LM and Megatron-Bridge only [default: the script's, else none]")]
CudaGraphScope = Annotated[Optional[str], typer.Option(
    "--cuda-graph-scope", help="what the graphs capture (Megatron-LM --cuda-graph-scope), comma-separated: attn, mlp, "
    "moe, moe_router, moe_preprocess (with transformer_engine) or full_iteration (with local) [default: the "
    "script's, else each whole decoder layer]")]
ActivationOffload = Annotated[Optional[int], typer.Option(
    "--activation-offload-layers", help="decoder layers whose saved activations go to host memory in forward and come "
    "back for backward (Megatron-Core cpu_offloading_num_layers: Megatron-LM main --cpu-offloading-num-layers, "
    "Megatron-Bridge model.cpu_offloading); needs pp 1 and no recompute [default: 0, none]")]
Fp8Bf16Layers = Annotated[Optional[str], typer.Option(
    "--fp8-bf16-layers", help="FIRST,LAST: decoder layers at the start and end that fp8 training keeps in bf16 "
    "(Megatron --first-last-layers-bf16 --num-layers-at-start/end-in-bf16; not with the delayed recipe; 1,1 for "
    "--target/--format megatron-bridge with tensorwise, as its current-scaling recipe) [default: the script's, else "
    "0,0]")]
