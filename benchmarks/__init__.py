"""The tf_autofuse benchmark suite: `python benchmarks/run.py --help`."""
