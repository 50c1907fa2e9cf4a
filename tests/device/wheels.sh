#!/bin/bash
# The wheels the device check installs on a machine that cannot reach a registry: Muster's
# dependencies for the CPython and platform of that machine's image (default 3.12, x86-64),
# into .dev/wheels (ignored by git; `carry` it with the repository).
set -eu
PY=${DEVICE_PYTHON:-3.12}
PIP=${PIP:-.venv/bin/pip}
DEST=.dev/wheels
mkdir -p $DEST
grep -q '^/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >> .git/info/exclude
reqs=$(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml","rb"))["project"]["dependencies"]))')
platforms="--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any"
# nkeys is published as a source distribution only: built here (pure Python); its pynacl is binary.
echo "$reqs" | grep -v '^nkeys' > $DEST/../reqs-binary.txt
$PIP download -q -r $DEST/../reqs-binary.txt pynacl --python-version $PY --only-binary=:all: $platforms -d $DEST
$PIP wheel -q --no-deps "$(echo "$reqs" | grep '^nkeys')" -w $DEST
echo "$reqs" > $DEST/../reqs.txt
du -sh $DEST
