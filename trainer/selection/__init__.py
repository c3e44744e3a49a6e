"""Model selection: search spaces, searches and model hopper parallelism."""
