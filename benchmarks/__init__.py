"""The project's measurements, one subpackage per study (``benchmarks/README.md``). Run a
script as a module from the repository root, e.g.
``python -m benchmarks.replication.mini_replication --help``. Not installed: ``setup.py``
ships ``megatron_endprompt`` only."""
