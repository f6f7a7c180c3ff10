"""The analytic cost model: parameters, memory, FLOPs, operator and collective time, step.

Nothing here knows about the CLI or file formats. Every function takes a :class:`Problem`, a
:class:`~autopar.layout_batch.LayoutBatch` and (where it matters) :class:`~autopar.cost.stage.Stages`,
and returns numpy arrays, so one formula serves both the vectorised search and ``estimate``.
"""
