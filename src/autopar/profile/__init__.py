"""Profiling that calibrates the planner (optional; needs ``pip install -e .[profile]``).

* :mod:`autopar.profile.opdb`: the SQLite operator knowledge base (no torch);
* :mod:`autopar.profile.provenance`: the device, software and precision rows were measured on,
  and whether they may cost the planned device (no torch);
* :mod:`autopar.profile.shapes`: the operator shapes a layout runs, from :mod:`autopar.cost.flops`;
* :mod:`autopar.profile.ops`: operator microbenchmarks (torch);
* :mod:`autopar.profile.layer`: the model's own decoder layer at a shard's width (transformers);
* :mod:`autopar.profile.comm`: collective sweeps under ``torchrun`` and their alpha-beta fit;
* :mod:`autopar.profile.provider`: measured times fed to :mod:`autopar.cost.compute`.

Only the modules that measure import torch; the planner never does.
"""
