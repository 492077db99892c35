"""HyFlash: on-device speculative decoding with a bounded-memory parallel drafter."""

__version__ = "0.1.0"
