"""The stages behind jaxspec.generate, one module each:

  batch.py        prompt and limit checks, length buckets, the padded batch and its empty cache
  prefill.py      the prompts' pass: the first token of every row (its own compiled program)
  plain.py        the autoregressive loop (one lax.while_loop of one-token steps)
  speculative.py  the speculative loop and its step: propose K, one target pass over K+1, verify
  programs.py     the compiled-program cache (bounded, clear()) and the trace counter
"""
