"""Pipeline parallelism: schedule simulation, per-layer cost tables and stage balancing."""
