"""The sources' and workers' pure machinery (no Ray): exactly-once bookkeeping,
backpressure in seconds of work, latency histograms, emulated service time,
live streams' checkpoints.
"""
