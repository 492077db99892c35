"""Export: lower a target + drafter pair into one bundle folder for a phone runtime.

``bundle.export_onnx_bundle`` writes an ONNX bundle (``onnx`` graphs, ``quantize``
recipes, a manifest built from the records of ``hyflash.bundle``, which defines the
format); ``hyflash.bundle.read_bundle`` is what every consumer calls to open one.
"""
