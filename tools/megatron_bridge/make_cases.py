"""Step 1, in autopar's environment: the issue-14 problem set (6 problems) x search targets x top 10,
each layout exported with ``--format megatron-bridge`` (or its refusal), into a JSON file.

    python make_cases.py megatron-bridge,megatron,torchtitan,deepspeed,galvatron cases.json
"""
import json, shlex, sys
from autopar.cli.inputs import problem_from_options
from autopar.export import WRITERS
from autopar.errors import AutoparError
from autopar.search import search
from autopar.search.grid import for_target

PROBLEMS = [("llama3-8b", 1, 128, 8192), ("llama3-70b", 8, 512, 8192), ("llama3.1-405b", 64, 2048, 8192),
            ("mixtral-8x7b", 4, 256, 4096), ("qwen3-30b-a3b", 2, 256, 4096), ("deepseek-v3", 128, 2048, 4096)]
TARGETS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["megatron-bridge", "megatron", "torchtitan", "deepspeed", "galvatron"]
cases = []
for model, nodes, gbs, seq in PROBLEMS:
    base = problem_from_options(model, "h100-80gb", nodes, None, gbs, seq, "bf16", None, None, None, None)
    for target in TARGETS:
        try:
            res = search(base, 10, target=target)
        except AutoparError as e:
            cases.append(dict(model=model, target=target, rank=None, refused=str(e)))
            continue
        p = for_target(base, "megatron-bridge")
        for rank, est in enumerate(res.layouts, 1):
            s = est.strategy
            try:
                text = WRITERS["megatron-bridge"](p, s)
            except AutoparError as e:
                cases.append(dict(model=model, target=target, rank=rank, refused=str(e)))
                continue
            words = shlex.split(text.split("\n", 4)[4].replace("\\\n", " "))
            cases.append(dict(model=model, target=target, rank=rank, text=text, words=words, world=p.world_size,
                              plan=dict(dp=s.dp, tp=s.tp, pp=s.pp, vpp=s.vpp, cp=s.cp, ep=s.ep, etp=s.expert_tp,
                                        mbs=s.mbs, gbs=gbs, sp=s.sp, zero=s.zero, recompute=s.recompute,
                                        recompute_layers=s.recompute_layers, modules=list(s.recompute_modules),
                                        split=list(s.layers_per_stage or []), seq=seq,
                                        emb=s.account_for_embedding, loss=s.account_for_loss,
                                        num_microbatches=gbs // (s.mbs * s.dp),
                                        dispatcher=("flex" if s.moe_dispatcher in ("deepep", "hybridep")
                                                    else s.moe_dispatcher))))
json.dump(cases, open(sys.argv[2] if len(sys.argv) > 2 else "cases.json", "w"))
print(len(cases), sum("text" in c for c in cases), "written")
