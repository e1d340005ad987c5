"""Ray actors: source, worker, aggregator, throttle, Spark/RayDP input."""
