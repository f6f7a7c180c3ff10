#!/usr/bin/env python3
"""Real-client check of an `autopar export --format deepspeed` config with DeepSpeed's own DeepSpeedConfig, on CPU.

Usage:
  $RC/venv-ds/bin/python deepspeed_check.py EXPORT WORLD_SIZE
  ... deepspeed_check.py --batch LIST          (LIST lines: EXPORT WORLD_SIZE)
EXPORT: the --out directory (ds_config.json + megatron_deepspeed_args.sh), a ds_config.json (its
megatron_deepspeed_args.sh beside it is read if present), or the one-file bash script autopar prints on stdout.

What runs (deepspeed 0.19.8, its code): deepspeed.runtime.config.DeepSpeedConfig(dict, mpu=MPU), where MPU is the
model-parallel unit Megatron-DeepSpeed hands to deepspeed.initialize: data-parallel world = WORLD_SIZE / (tp * pp)
read from the Megatron-DeepSpeed arguments (tp = --tensor-model-parallel-size, pp = --pipeline-model-parallel-size,
1 with --no-pipeline-parallel); DeepSpeed then checks train_batch_size == micro * grad_accum * dp and validates the
zero/bf16/fp16 sections. Shim: deepspeed.comm.get_rank() -> 0 (no process group here; without it DeepSpeedConfig silently
uses world size 1 instead of the mpu's). Also checked (ours, not DeepSpeed's): --micro-batch-size / --global-batch-size /
--zero-stage in the arguments agree with the JSON, --checkpoint-activations has its deepspeed flags.
Then, when MDS_SRC (default $RC/mds: megatron/ and tools/ of microsoft/Megatron-DeepSpeed, from
setup.sh megatron-deepspeed) exists: Megatron-DeepSpeed's own parse_args + validate_args on the arguments
(see mds_check for its stubs); its effective dp/tp/pp/mbs/gbs/zero go to EFFECTIVE['mds'].
Output: 'OK <export> ...' / 'REJECTED <export> ...' and 'EFFECTIVE <export> {json}'. Exit 0/1, 2 bad input.
"""
import contextlib
import io
import json
import logging
import os
import re
import shlex
import sys
import traceback
import warnings

from driver_io import bad_input, fork_each, read_jobs, report

warnings.filterwarnings("ignore")


def read_env(script):
    env = {}
    for line in (script or "").splitlines():
        m = re.match(r"\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=(\S*)\s*$", line)
        if m:
            env[m.group(1)] = m.group(2)
    return env


def read_export(path):
    """(ds config dict, Megatron-DeepSpeed argv list or None, env exports)."""
    if os.path.isdir(path):
        path = os.path.join(path, "ds_config.json")
    text = open(path).read()
    if path.endswith(".json"):
        cfg = json.loads(text)
        sh = os.path.join(os.path.dirname(path), "megatron_deepspeed_args.sh")
        script = open(sh).read() if os.path.exists(sh) else None
    else:  # the stdout bash script: heredoc JSON + torchrun line
        m = re.search(r"<<'EOF'\n(.*?)\nEOF\n", text, re.S)
        cfg = json.loads(m.group(1))
        script = text[m.end():]
    argv, env = None, read_env(script if path.endswith(".json") else text)
    if script:
        body = script.replace("\\\n", " ")
        for line in body.splitlines():
            if "pretrain_gpt.py" in line and not line.lstrip().startswith("#"):
                toks = shlex.split(line.replace('"$(dirname "$0")"', "."), comments=True)
                argv = toks[toks.index("pretrain_gpt.py") + 1:]
    return cfg, argv, env


def opt(argv, name, default=None):
    if argv and name in argv:
        i = argv.index(name)
        return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
    return default


MDS_SRC = os.environ.get("MDS_SRC", os.path.join(os.environ.get("RC", "."), "mds"))
MDS_STUBS = ("six", "regex", "transformers", "apex", "amp_C", "flash_attn", "sentencepiece", "tiktoken", "nltk", "wandb")


def mds_check(argv, env, world, cfg):
    """Megatron-DeepSpeed's own parse_args + validate_args (pretrain_gpt's args_defaults) in a forked child.
    Stubs (ours): tokenizer / fused-kernel packages its imports pull (MDS_STUBS, never called by argument code);
    the accelerator reports 'cuda' (an H100 job) so its CUDA_DEVICE_MAX_CONNECTIONS check runs; the script's
    exports are applied; --deepspeed_config points at a temp copy of the JSON."""
    import tempfile
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        data = os.fdopen(r).read()
        os.waitpid(pid, 0)
        res = json.loads(data) if data else {"ok": False, "msg": "crash"}
        return res["ok"], res["msg"]
    os.close(r)
    out = {"ok": False, "msg": "?"}
    try:
        import importlib.abc
        import importlib.machinery
        from unittest import mock

        class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in MDS_STUBS:
                    return importlib.machinery.ModuleSpec(name, self, is_package=True)

            def create_module(self, spec):
                m = mock.MagicMock(name=spec.name)
                m.__path__, m.__spec__, m.__version__ = [], spec, "2.6.3"
                return m

            def exec_module(self, m):
                pass
        sys.meta_path.insert(0, Stub())
        sys.path.insert(0, MDS_SRC)
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0", **env)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(cfg, f)
        av = list(argv)
        if "--deepspeed_config" in av:
            av[av.index("--deepspeed_config") + 1] = f.name
        stage = "parse_args"
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            import deepspeed.accelerator as DA
            DA.get_accelerator().device_name = lambda *a, **k: "cuda"
            import megatron.arguments as MA
            sys.argv = ["pretrain_gpt.py", *av]
            try:
                args = MA.parse_args()
            except SystemExit as e:
                raise RuntimeError(f"argparse exit {e.code}: {err.getvalue().strip().splitlines()[-1:]}")
            stage = "validate_args"
            MA.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
            stage = "core_transformer_config_from_args"
            if hasattr(MA, "core_transformer_config_from_args"):
                MA.core_transformer_config_from_args(args)
        out = {"ok": True, "msg": dict(dp=args.data_parallel_size, tp=args.tensor_model_parallel_size,
                                       pp=args.pipeline_model_parallel_size, mbs=args.micro_batch_size,
                                       gbs=args.global_batch_size, sp=args.sequence_parallel,
                                       zero_stage=args.zero_stage, ds_pipeline=args.ds_pipeline_enabled,
                                       checkpoint_activations=args.checkpoint_activations,
                                       recompute_granularity=args.recompute_granularity,
                                       checkpoint_num_layers=args.checkpoint_num_layers,
                                       num_key_value_heads=args.num_key_value_heads,
                                       use_flash_attn_v2=getattr(args, "use_flash_attn_v2", None))}
    except BaseException as e:  # noqa: BLE001
        out = {"ok": False, "msg": f"[{stage if 'stage' in dir() else 'import'}] {type(e).__name__}: {str(e).strip()[:500]}"}
    finally:
        os.write(w, json.dumps(out, default=str).encode())
        os._exit(0)


class MPU:
    """What Megatron-DeepSpeed's mpu answers DeepSpeedConfig (data-parallel world) and the engine.

    With DeepSpeed Ulysses (``--ds-sequence-parallel-size sp``) Megatron-DeepSpeed's
    ``parallel_state.initialize_model_parallel`` builds the data-parallel groups over
    world / (tp * pp * sp) ranks, and the sequence-data-parallel groups over sp * dp."""
    def __init__(self, dp, tp, pp, sp=1):
        self.dp, self.tp, self.pp, self.sp = dp, tp, pp, sp

    def get_data_parallel_world_size(self):
        return self.dp

    def get_data_parallel_rank(self):
        return 0

    def get_model_parallel_world_size(self):
        return self.tp

    def get_tensor_model_parallel_world_size(self):
        return self.tp

    def get_pipeline_model_parallel_world_size(self):
        return self.pp

    def get_sequence_parallel_world_size(self):
        return self.sp

    def get_sequence_data_parallel_world_size(self):
        return self.dp * self.sp


def check(path, world):
    cfg, argv, env = read_export(path)
    tp = int(opt(argv, "--tensor-model-parallel-size", 1))
    pp = 1 if opt(argv, "--no-pipeline-parallel") else int(opt(argv, "--pipeline-model-parallel-size", 1))
    sp = int(opt(argv, "--ds-sequence-parallel-size", 1))
    notes = []
    if world % (tp * pp * sp):
        return False, f"[world] {world} not divisible by tp*pp*sp={tp * pp * sp}", None
    dp = world // (tp * pp * sp)
    stage = "DeepSpeedConfig"
    try:
        import deepspeed.runtime.config as C
        C.dist.get_rank = lambda *a, **k: 0  # rank 0 of an initialised job (no process group here)
        ds = C.DeepSpeedConfig(dict(cfg), mpu=MPU(dp, tp, pp, sp))
    except SystemExit as e:
        return False, f"[{stage}] exit {e.code}", None
    except BaseException as e:  # noqa: BLE001
        tb = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{tb.filename.split('site-packages/')[-1]}:{tb.lineno}"
        return False, f"[{stage}] {type(e).__name__}: {str(e).strip()[:600]} ({where})", None
    if ds.world_size != dp:
        notes.append(f"DeepSpeed world_size {ds.world_size} != dp {dp}")
    mbs, gbs, zs = opt(argv, "--micro-batch-size"), opt(argv, "--global-batch-size"), opt(argv, "--zero-stage")
    if argv is not None:
        if mbs is not None and int(mbs) != ds.train_micro_batch_size_per_gpu:
            notes.append(f"--micro-batch-size {mbs} != json {ds.train_micro_batch_size_per_gpu}")
        if gbs is not None and int(gbs) != ds.train_batch_size:
            notes.append(f"--global-batch-size {gbs} != json {ds.train_batch_size}")
        if zs is not None and int(zs) != ds.zero_optimization_stage:
            notes.append(f"--zero-stage {zs} != json stage {ds.zero_optimization_stage}")
        if opt(argv, "--checkpoint-activations") and not opt(argv, "--deepspeed-activation-checkpointing"):
            notes.append("--checkpoint-activations without --deepspeed-activation-checkpointing")
    else:
        notes.append("no Megatron-DeepSpeed arguments found: dp = world")
    mds = None
    if argv is not None and os.path.isdir(MDS_SRC):
        ok, mds = mds_check(argv, env, world, cfg)
        if not ok:
            return False, f"[Megatron-DeepSpeed] {mds}", None
    eff = dict(world=world, tp=tp, pp=pp, dp=dp, mds=mds, ds_world_size=ds.world_size, train_batch_size=ds.train_batch_size,
               micro_batch=ds.train_micro_batch_size_per_gpu, grad_accum=ds.gradient_accumulation_steps,
               product=ds.train_micro_batch_size_per_gpu * ds.gradient_accumulation_steps * ds.world_size,
               zero_stage=ds.zero_optimization_stage, bf16=ds.bfloat16_config.enabled, fp16=ds.float16_config.enabled,
               gradient_clipping=ds.gradient_clipping,
               activation_checkpointing={k: v for k, v in vars(ds.activation_checkpointing_config).items() if not k.startswith("_")},
               argv_recompute=[a for a in (argv or []) if "checkpoint" in a or "recompute" in a],
               checkpoint_num_layers=opt(argv, "--checkpoint-num-layers"), seq_len=opt(argv, "--seq-length"),
               recompute_method=opt(argv, "--recompute-method"), recompute_num_layers=opt(argv, "--recompute-num-layers"),
               sp=bool(opt(argv, "--sequence-parallel")), notes=notes)
    return True, (f"dp={dp} tp={tp} pp={pp} train_batch={ds.train_batch_size} = micro {ds.train_micro_batch_size_per_gpu}"
                  f" x accum {ds.gradient_accumulation_steps} x dp {ds.world_size} zero={ds.zero_optimization_stage}"), eff


def run_one(path, world):
    try:
        ok, msg, eff = check(path, int(world))
    except (OSError, ValueError, AttributeError) as e:
        return bad_input(path, e)
    return report(path, ok, msg, eff)


def main():
    jobs = read_jobs(__doc__, 2)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    logging.disable(logging.WARNING)
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        import deepspeed.runtime.config  # noqa: F401  (once, before forking)
    fork_each(jobs, run_one)


if __name__ == "__main__":
    main()
