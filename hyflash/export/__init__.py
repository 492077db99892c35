"""Export: lower a target + drafter pair into one bundle folder for a phone runtime.

``bundle.export_onnx_bundle`` writes an ONNX bundle (``onnx`` graphs, ``quantize``
recipes, ``manifest`` with hashes and I/O contracts); ``manifest.read_bundle`` is what
every consumer calls to open one.
"""
