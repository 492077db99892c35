"""What `hyflash bench` runs side by side: a system is one configuration of one runtime.

A ``System`` says how to run it (``kind``: which worker; ``request``: what the worker
reads; ``python``: the interpreter, another venv's for onnxruntime-genai) and how to
read its modes (``plain``, ``speculative``, ``speculative+auto-rows``, ``lookup``,
``speculative+lookup``, ``adaptive``). A
``Skipped`` is a configuration that could not run here, with the reason: the report lists
it, so no peer is ever dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class System:
    label: str          # the row's name, e.g. "ours ORT lean int4"
    kind: str           # ours | transformers | optimum | genai | native | llamacpp
    group: str          # ours | peer
    quant: str
    request: dict = field(default_factory=dict)  # folder, prompt_lookup, ngram, ...
    python: str | None = None  # interpreter for the worker (None: this one)
    note: str = ""      # shown under the table (how it was built)


@dataclass
class Skipped:
    label: str
    group: str
    reason: str


# a mode's row claims identical output to this mode of the same system (lossless pairs)
LOSSLESS_PAIRS = {"speculative": "plain", "speculative+auto-rows": "plain", "lookup": "plain",
                  "speculative+lookup": "plain", "adaptive": "plain"}
