#!/usr/bin/env bash
# The UCI handwritten digits (1797 8x8 images, 10 classes) as a CSV, from the copy Debian ships
# in python3-sklearn: taken from the installed package if there is one, else from the package
# file alone (apt-get download: none of its dependencies are installed).
#   scripts/fetch_digits.sh DEST.csv     exit 0 with DEST written, 1 when it cannot be had
set -euo pipefail
dest="$1"
[ -s "$dest" ] && exit 0
installed=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ -f "$installed" ]; then
  cp "$installed" "$tmp/digits.csv.gz"
else
  # A fresh machine may have no package lists yet: refresh them once and try again.
  (cd "$tmp" && apt-get download python3-sklearn >/dev/null 2>&1) ||
    { [ "$(id -u)" -eq 0 ] && apt-get update -qq >/dev/null 2>&1 && (cd "$tmp" && apt-get download python3-sklearn >/dev/null 2>&1); } ||
    { echo "fetch_digits: apt-get download python3-sklearn failed" >&2; exit 1; }
  dpkg-deb -x "$tmp"/python3-sklearn_*.deb "$tmp/x"
  cp "$tmp/x/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz" "$tmp/digits.csv.gz"
fi
mkdir -p "$(dirname "$dest")"
gzip -dc "$tmp/digits.csv.gz" > "$tmp/digits.csv"
lines=$(wc -l < "$tmp/digits.csv")
[ "$lines" -eq 1797 ] || { echo "fetch_digits: expected 1797 samples, got $lines" >&2; exit 1; }
mv "$tmp/digits.csv" "$dest"
