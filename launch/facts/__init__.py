"""Facts about the machine and the model, read before any process starts: installed versions and GPUs, the pins and
locks, the hub, the model's modules, and the constants measured on a GPU."""
