"""Speed: what a run measured, the throughput model's prediction before it, and `--fastest`."""
