"""SwiftSpec: asynchronous, disaggregated tree speculative decoding for one fast stream."""

__version__ = "0.1.0"
