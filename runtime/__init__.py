"""Load-balancing runtime for stream processing on heterogeneous clusters.

``runtime`` is engine independent: grouping schemes, hashing, sketches, the
topology schema, applications, metrics, reports and the discrete-event
simulator. Only ``actors/`` (and ``runtime.run``) import Ray.
"""

__version__ = "0.1.0"
