"""Verify planned layouts with short real runs in the user's framework, and learn from them.

* :mod:`~autopar.verify.jobs`: one short-run job per layout (Megatron-LM / MindSpeed-LLM launch
  script rewritten, or a torchtitan TOML), each in its own work folder;
* :mod:`~autopar.verify.launch`: ``torchrun`` on this node or Slurm (``sbatch``/``srun``), with a
  time limit and no process left behind;
* :mod:`~autopar.verify.logs`: the frameworks' own log lines -> step time, tokens/s, peak memory,
  failure and cause;
* :mod:`~autopar.verify.shrink`: a small run (fewer layers, pp stages and dp ranks, the same
  per-device shapes) that stands for a large plan;
* :mod:`~autopar.verify.report`: predicted vs measured per layout, re-ranked by measurement;
* :mod:`~autopar.verify.calibrate`: efficiency factors fitted to the runs stored in the profile DB.
"""
