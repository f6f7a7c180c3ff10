"""Writers that turn a layout into a target framework's configuration (no cost recomputed)."""
