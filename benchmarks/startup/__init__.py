"""Start-up at corpus scale: dataset build time, bytes read and peak RSS per rank
(``README.md`` here)."""
