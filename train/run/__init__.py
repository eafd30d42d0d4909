"""The run: the training step, checkpoints and loading them, the optimizer, settings checks,
metrics, plots, memory and throughput, the workdir, and launching several processes."""
