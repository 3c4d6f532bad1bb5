"""Job layer: the recsys-alibi command and the scheduled pipeline."""
