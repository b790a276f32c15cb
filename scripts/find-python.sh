#!/usr/bin/env bash
# bash scripts/find-python.sh NAME MODULE...: prints the first Python that has every MODULE, of $PYTHON (only it when
# set), the repository's .venv/bin/python, python3 and python on PATH; else says in one line, as ERROR: [NAME], what
# each one lacks and that PYTHON= names another. scripts/prepare-*.sh run their prepare.py with it.
name=$1; shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -n "${PYTHON:-}" ]; then candidates=("$PYTHON"); else candidates=("$here/../.venv/bin/python" python3 python); fi
# find_spec imports nothing (fairseq takes seconds); run from scripts/, where prepare.py looks for its modules first
check='import importlib.util as u, sys; print(" ".join(m for m in sys.argv[1:] if u.find_spec(m) is None))'
tried=()
for py in "${candidates[@]}"; do
    [[ $py == */* && $py != /* ]] && py=$PWD/$py
    if ! command -v "$py" >/dev/null 2>&1; then tried+=("$py: not found"); continue; fi
    if ! missing=$(cd "$here" && "$py" -c "$check" "$@" 2>/dev/null); then tried+=("$py: does not run"); continue; fi
    if [ -z "$missing" ]; then echo "$py"; exit 0; fi
    tried+=("$py lacks ${missing// /, }")
done
summary=$(IFS=';'; echo "${tried[*]}")
modules="$*"
echo "ERROR: [$name] no Python here has ${modules// /, }: ${summary//;/; }; install them (make setup makes .venv/ with all), or name" \
     "the Python that has them: PYTHON=/path/to/python bash scripts/prepare-$name.sh ..." >&2
exit 1
