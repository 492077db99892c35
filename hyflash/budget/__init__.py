"""`hyflash budget`: size a target + drafter pair for a phone before and after export.

One job per module: ``shapes`` (a model as numbers), ``sources`` (bundle, config, GGUF,
hub id or preset -> shapes), ``recipes`` (how each quantization recipe stores weights),
``runtime_costs`` (what a runtime adds, measured here) and ``phone_fit`` (ExecuTorch's
factors fitted on published phone RSS), ``memory`` (every term, with formula), ``plan``
(flags -> what to size), ``devices`` (profiles), ``roofline`` (phone decode speed,
calibrated), ``report`` / ``plot`` (output), ``measure`` / ``measure_report`` (run a
bundle, compare), ``tau`` (simulate's measured tau per bundle) and ``phone`` (the rows
`hyflash simulate --device` adds). It reads bundles through ``hyflash.bundle`` and never
imports ``hyflash.export``.
"""
