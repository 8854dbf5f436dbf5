#!/usr/bin/env bash
# Writes a vcpkg overlay port of elastic that builds one commit of this clone (HEAD by default):
#
#   scripts/vcpkg-overlay.sh OUT_DIR [COMMIT]
#   vcpkg install "elastic[gloo,tools]" --overlay-ports=OUT_DIR
#
# OUT_DIR/elastic is ports/elastic as of that commit, plus source-from-clone.cmake, which names
# the clone (a file:// URL) and the commit; the portfile then fetches that commit with
# vcpkg_from_git. The commit is part of the port's files, so vcpkg's ABI hash follows it: run the
# script again after a new commit and vcpkg rebuilds. Uncommitted changes are not in the overlay.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  sed -n '2,10s/^# \{0,1\}//p' "$0" >&2
  exit 2
fi
out=$1
ref=${2:-HEAD}

clone=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
commit=$(git -C "$clone" rev-parse --verify "$ref^{commit}")
if ! git -C "$clone" cat-file -e "$commit:ports/elastic/portfile.cmake" 2>/dev/null; then
  echo "vcpkg-overlay: commit $commit has no ports/elastic/portfile.cmake" >&2
  exit 1
fi
if [ "$ref" = HEAD ] && [ -n "$(git -C "$clone" status --porcelain --untracked-files=no)" ]; then
  echo "vcpkg-overlay: note: $clone has uncommitted changes; the overlay builds commit $commit without them" >&2
fi

port="$out/elastic"
rm -rf "$port"
mkdir -p "$port"
git -C "$clone" archive "$commit" ports/elastic | tar -x -C "$port" --strip-components=2
cat > "$port/source-from-clone.cmake" <<EOF
# Written by scripts/vcpkg-overlay.sh: this overlay port builds commit $commit of the clone below.
set(ELASTIC_GIT_URL "file://$clone")
set(ELASTIC_GIT_REF "$commit")
EOF
echo "$port"
