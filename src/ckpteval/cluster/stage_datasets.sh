# Stage datasets into the cluster's dataset cache, on the login node.
# Run as: bash -c "$(cat this)" ckpteval-data ROOT SLUG... with a tar stream on stdin holding, for each
# SLUG, its files, `ckpteval/SLUG.json` (its manifest) and `lists/SLUG` (its file list), plus SHA256SUMS.
# - One push at a time: an flock on ROOT/.push.lock; a second push waits, then finds its datasets present.
# - Checked by content: every file's sha256 is verified before anything is moved into place.
# - Atomic per dataset: files are unpacked under ROOT/.push-XXXX, moved into place, and the manifest
#   moved last; a push cut off half-way leaves no manifest, so nothing reads as staged.
# stdout: "ckpteval-data: present|staged SLUG". Exit: 10 cannot write, 11 lock, 12 bad stream, 13 checksum.
set -u
root=$1
shift
say() { printf 'ckpteval-data: %s\n' "$*"; }
fail() {
  local code=$1
  shift
  printf 'ckpteval-data: error: %s\n' "$*" >&2
  exit "$code"
}
mkdir -p -- "$root/ckpteval" 2>/dev/null || fail 10 "cannot create $root"
[ -w "$root" ] || fail 10 "cannot write to $root"
exec 9>>"$root/.push.lock" || fail 10 "cannot create the lock file $root/.push.lock"
flock 9 || fail 11 "cannot lock $root/.push.lock"
part=$(mktemp -d "$root/.push-XXXXXX") || fail 10 "cannot create a temporary directory in $root"
trap 'rm -rf -- "$part"' EXIT
trap 'exit 15' TERM INT HUP
tar -x -C "$part" -f - || fail 12 "the data stream was cut off or is not a tar archive"
(cd "$part" && sha256sum --quiet --strict -c SHA256SUMS >&2) || fail 13 "a file's content does not match its sha256"
for slug in "$@"; do
  if [ -s "$root/ckpteval/$slug.json" ] && cmp -s -- "$part/ckpteval/$slug.json" "$root/ckpteval/$slug.json"; then
    say "present $slug"
    continue
  fi
  while IFS= read -r f; do
    if [ -e "$part/$f" ] || [ -L "$part/$f" ]; then
      mkdir -p -- "$root/$(dirname -- "$f")" && mv -f -- "$part/$f" "$root/$f" || fail 10 "cannot move $f into $root"
    fi
  done <"$part/lists/$slug"
  mv -f -- "$part/ckpteval/$slug.json" "$root/ckpteval/$slug.json" || fail 10 "cannot write the manifest of $slug"
  say "staged $slug"
done
