"""jaxspec training package: self-distilled data and draft-head training (imports jaxspec, never the reverse)."""
