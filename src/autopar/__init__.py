"""autopar: plan the parallel layout of large-language-model training.

The flow is one-way (see DESIGN.md): specs (model, cluster, training) go into the layout
space, each layout is costed (memory, time), the search ranks the ones that fit, and the
report/export layers present them.
"""

import time as _time

STARTED_S = _time.perf_counter()  # when autopar was first imported: a command's start, for its JSON ``command_s``

from autopar.errors import AutoparError, LayoutError  # noqa: E402

__all__ = ["AutoparError", "LayoutError", "__version__"]
__version__ = "0.1.0"
