"""Recording: cameras, the loop-side recorder and the writer process that owns the dataset."""
