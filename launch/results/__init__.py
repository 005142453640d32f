"""What a run produced, read back and judged: the output folder that belongs to the run (`outdir`), the expected
metrics of a recipe (`expected`), a run's per-step history (`history`), the verdict and the record command (`judge`),
the one step-by-step difference (`stepdiff`), the compare plots (`plots`) and the first-steps loss band (`sentinel`)."""
