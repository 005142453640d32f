"""Facts about the machine, the model and the data, read before any process starts: installed versions and GPUs, the
pins and locks, the hub, the model's modules, the dataset's token lengths, and the constants measured on a GPU."""
