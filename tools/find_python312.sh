#!/usr/bin/env bash
# Print the path of a working Python 3.12 interpreter (PATH, then pyenv), or fail clearly.
for cand in python3.12 "$(command -v pyenv >/dev/null && echo "$(pyenv root)")"/versions/3.12*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12; do
  if [ -n "$cand" ] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
    command -v "$cand" 2>/dev/null || echo "$cand"
    exit 0
  fi
done
echo "error: Python 3.12 not found (megatron-core >= 0.17 needs it); install it, e.g. 'pyenv install 3.12'" >&2
exit 1
