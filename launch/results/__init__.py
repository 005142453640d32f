"""What a run produced, read back and judged: the expected metrics of a recipe (`expected`), a run's per-step
history (`history`), the verdict and the record command (`judge`), the one step-by-step difference (`stepdiff`) and
the compare plots (`plots`)."""
