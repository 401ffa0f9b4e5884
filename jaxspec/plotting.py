"""matplotlib for the pictures of `jaxspec bench` and of training runs. It is the `plot` extra
(`pip install 'jaxspec[plot]'`; the `dev` and `notebooks` extras include it): without it the numbers
are still written, and one warning says which pictures were skipped."""
from __future__ import annotations

import warnings

EXTRA = "pip install 'jaxspec[plot]'"


def pyplot(skipped: str = "plots"):
    """matplotlib.pyplot drawing to files (the Agg backend), or None with a warning naming what is
    `skipped` when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn(f"matplotlib is not installed: {skipped} skipped ({EXTRA})", stacklevel=3)
        return None
    return plt
