"""The pieces every layer uses: the data types, registries, seeds, metrics logging, precision and checkpoints."""
