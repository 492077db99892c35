"""`hyflash demo` and `hyflash bench`: the product end to end, and measured against peers.

- ``exports``: bundles written once by ``hyflash export`` and reused while still valid
  (the manifest's file hashes and the identity of the inputs both checked);
- ``prompts``: held-out code prompts (the stdlib split no model here trained on);
- ``demo`` / ``demo_report``: export, simulate with streaming, budget, one report folder;
- ``command`` / ``suites`` / ``scripts``: `hyflash bench`, what each suite runs, and the
  focused scripts of ``benchmarks/`` behind the same entry point;
- ``systems`` / ``runs``: every configuration in its own process, round robin, medians,
  lossless pairs checked; ``worker`` is that process for our runtimes, transformers and
  optimum, ``genai_worker`` for onnxruntime-genai (its own venv), ``native`` runs the C++
  runtime, ``llamacpp`` llama.cpp's server (``gguf_writer`` when its converter refuses a
  model); ``peers`` finds, builds or explains each peer;
- ``acceptance``, ``memory``: tau and draft-side bytes by context;
- ``report`` / ``plot``: Markdown, JSON, PNG and the goals in plain words.
"""
