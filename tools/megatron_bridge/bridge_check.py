"""Step 2, in a Megatron-Bridge environment (see README.md here): build each case's recipe (model from autopar's
preset HF config instead of the hub), apply the written overrides with Bridge's own
process_config_with_overrides, run Bridge's runtime_config_update (mixed precision setup,
comm overlap, ConfigContainer.validate -> model.finalize -> Megatron-Core TransformerConfig
checks), then compare what Bridge will run with the plan field by field."""
import warnings; warnings.filterwarnings("ignore")
import json, os, sys, traceback, logging
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
logging.disable(logging.WARNING)
import megatron.core, megatron.core.transformer.transformer_config, megatron.core.models.gpt  # noqa
import megatron.core.extensions  # noqa: F401
import stub_te  # noqa: F401  (a stand-in for Bridge's own module-level TE imports only)
import transformers
from megatron.bridge.models.conversion.auto_bridge import AutoBridge
import megatron.bridge.recipes as recipes
from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides
from megatron.bridge.training import config as bcfg

from pathlib import Path

PRESETS = Path(__file__).resolve().parents[2] / "src" / "autopar" / "data" / "models"
def fake_from_hf_pretrained(path, **kw):
    name = {"meta-llama/Meta-Llama-3-8B": "llama3-8b", "meta-llama/Meta-Llama-3-70B": "llama3-70b",
            "meta-llama/Llama-3.1-405B": "llama3.1-405b", "meta-llama/Meta-Llama-3.1-405B": "llama3.1-405b", "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b",
            "deepseek-ai/DeepSeek-V3": "deepseek-v3", "deepseek-ai/DeepSeek-V3-Base": "deepseek-v3"}[str(path)]
    d = json.load(open(f"{PRESETS}/{name}.json"))
    d.pop("auto_map", None)
    if name == "deepseek-v3":  # in the hub's config.json, not in autopar's trimmed preset
        d.update(scoring_func="sigmoid", topk_method="noaux_tc", routed_scaling_factor=2.5, norm_topk_prob=True)
    cfg = transformers.AutoConfig.for_model(**d)
    return AutoBridge.from_hf_config(cfg)
AutoBridge.from_hf_pretrained = classmethod(lambda cls, path, **kw: fake_from_hf_pretrained(path, **kw))

import torch, types as _t
# The device the plans are for (H100: compute capability 9.0); this CPU build has no CUDA.
torch.cuda.get_device_properties = lambda *a, **k: _t.SimpleNamespace(major=9, minor=0, name="NVIDIA H100 80GB HBM3")
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
# Kernel switches that need Transformer Engine, absent on CPU; none of them is part of the layout.
TE_ONLY = ("apply_rope_fusion", "moe_permute_fusion")

cases = json.load(open(sys.argv[1]))
ok = bad = 0
for c in cases:
    if "words" not in c:
        continue
    w = c["words"]
    recipe = w[w.index("--recipe") + 1]
    ovs = [x for x in w if "=" in x and not x.startswith("-")]
    nnodes, nproc = int(w[w.index("--nnodes") + 1]), int(w[w.index("--nproc_per_node") + 1])
    os.environ["WORLD_SIZE"] = str(nnodes * nproc); os.environ["RANK"] = "0"; os.environ["LOCAL_RANK"] = "0"
    try:
        cfg = getattr(recipes, recipe)()
        cfg = process_config_with_overrides(cfg, cli_overrides=ovs)
        for f in TE_ONLY:
            setattr(cfg.model, f, False)
        bcfg.runtime_config_update(cfg)
        m, t, pl = cfg.model, cfg.train, c["plan"]
        got = dict(dp=cfg.data_parallel_size, tp=m.tensor_model_parallel_size, pp=m.pipeline_model_parallel_size,
                   vpp=m.virtual_pipeline_model_parallel_size or 1, cp=m.context_parallel_size,
                   ep=m.expert_model_parallel_size, etp=m.expert_tensor_parallel_size or m.tensor_model_parallel_size,
                   mbs=t.micro_batch_size, gbs=t.global_batch_size, sp=m.sequence_parallel,
                   zero=(3 if cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params" else 2)
                        if cfg.ddp.use_megatron_fsdp else int(cfg.ddp.use_distributed_optimizer),
                   recompute=m.recompute_granularity or "none",
                   recompute_layers=(m.recompute_num_layers if m.recompute_method == "block" else None),
                   seq=m.seq_length, emb=m.account_for_embedding_in_pipeline_split,
                   loss=m.account_for_loss_in_pipeline_split,
                   num_microbatches=t.global_batch_size // (t.micro_batch_size * cfg.data_parallel_size))
        if pl["recompute"] == "selective":
            got["modules"] = list(m.recompute_modules)
        want = {k: pl[k] for k in got if k in pl}
        if pl["recompute"] != "selective":
            want.pop("modules", None)
        split_ok = True
        if pl["split"] and len(set(pl["split"])) > 1 and not (pl["emb"] or pl["loss"]):
            split_ok = (m.num_layers_in_first_pipeline_stage, m.num_layers_in_last_pipeline_stage) == (pl["split"][0], pl["split"][-1])
        o = cfg.optimizer
        prec = (cfg.mixed_precision.bf16, cfg.mixed_precision.fp8, m.bf16, m.fp8, cfg.ddp.grad_reduce_in_fp32,
                m.tp_comm_overlap, getattr(m, "moe_token_dispatcher_type", None), o.use_precision_aware_optimizer,
                {str(getattr(o, n)) for n in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")},
                cfg.dataset.sequence_length)
        diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        want_prec = (True, None, True, None, True, False, pl.get("dispatcher", "alltoall") if m.num_moe_experts else prec[6], False, {"torch.float32"}, pl["seq"])
        if diff or not split_ok or prec != want_prec:
            bad += 1
            print("MISMATCH", c["model"], c["target"], c["rank"], diff, split_ok, prec)
        else:
            ok += 1
    except Exception as e:
        bad += 1
        print("REJECTED", c["model"], c["target"], c["rank"], type(e).__name__, str(e)[:300].replace("\n", " "))
        if os.environ.get("TB"): traceback.print_exc(limit=-14)
print(f"accepted and equal: {ok}, rejected or different: {bad}")
