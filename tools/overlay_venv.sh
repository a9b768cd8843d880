#!/usr/bin/env bash
# Make NEW, a virtual environment that is BASE with one package replaced, in seconds and
# ~35 MiB instead of a second multi-GB install (torch's CUDA wheel and its nvidia-* libraries):
#
#   tools/overlay_venv.sh .venv .venv-mc018 megatron-core==0.18.2
#
# NEW gets REQUIREMENT alone (--no-deps; it must need nothing BASE lacks), then a .pth that adds
# BASE's site-packages *after* NEW's own, so REQUIREMENT's modules and metadata shadow BASE's and
# everything else comes from BASE. Processes started as NEW/bin/python (tests' sys.executable,
# `python -m torch.distributed.run`) see the same overlay whatever PYTHONPATH they are given.
# The last step checks that REQUIREMENT's distribution resolves from NEW, or fails.
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "error: usage: tools/overlay_venv.sh BASE_VENV NEW_VENV NAME==VERSION" >&2
  exit 2
fi
base=$1 new=$2 req=$3
name=${req%%==*} version=${req#*==}
if [ "$name" = "$req" ] || [ -z "$version" ]; then
  echo "error: overlay_venv.sh: '$req' must pin one version, e.g. megatron-core==0.18.2" >&2
  exit 2
fi
if [ ! -x "$base/bin/python" ]; then
  echo "error: overlay_venv.sh: $base/bin/python not found; create it first (make venv)" >&2
  exit 2
fi
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')  # absolute
if [ ! -x "$new/bin/python" ]; then
  # The base interpreter behind BASE (a venv's python is a link to it), not BASE itself.
  "$("$base/bin/python" -c 'import sys; print(sys._base_executable)')" -m venv "$new"
fi
new_site=$("$new/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
rm -f "$new_site/_overlay_base.pth"   # pip must see only NEW while it installs
"$new/bin/python" -m pip install -q --no-deps "$req"
# addsitedir (not a bare path line) so BASE's own .pth files (editable installs) apply too.
echo "import site; site.addsitedir('$base_site')" > "$new_site/_overlay_base.pth"
"$new/bin/python" - "$name" "$version" "$new_site" <<'EOF'
import importlib.metadata as md
import os
import sys

name, version, new_site = sys.argv[1:]
dist = md.distribution(name)
where = os.path.realpath(str(dist.locate_file("")))
if dist.version != version or where != os.path.realpath(new_site):
    sys.exit(f"error: overlay_venv.sh: {name} resolves to {dist.version} at {where}, "
             f"not {version} at {new_site}")
print(f"overlay: {name} {version} from {new_site}; the rest from the base venv")
EOF
