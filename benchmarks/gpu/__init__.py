"""The one prepared GPU check: ``benchmarks/gpu_check.sh`` runs ``benchmarks.gpu.check``
(``README.md`` here)."""
