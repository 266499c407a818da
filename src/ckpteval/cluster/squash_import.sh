# Import one container image into the .sqsh cache, on the login node of a Slurm cluster.
# Run as: bash -c "$(cat this)" ckpteval-squash TARGET URI FORCE CACHE_DIR DATA_DIR SRUN_ARGV...
# Every value arrives as a positional parameter: nothing here is pasted into a command line.
#
# - One import per image at a time: an flock on TARGET.lock, held for the whole import; a second
#   invocation waits, then finds TARGET present. The lock file is removed by its holder.
# - Atomic: enroot writes TARGET.part, which is checked (squashfs magic) and renamed to TARGET.
#   A failed or interrupted import leaves neither TARGET.part nor TARGET.lock.
# - If the client goes away (the SSH connection drops, the CLI is killed), stdin reaches EOF and
#   the import is cancelled and cleaned up. So the client must hold stdin open (and send nothing)
#   for as long as the script runs.
# stdout: "ckpteval-squash: STATE ..." lines for the client; stderr: srun's and enroot's output.
# Exit: 0 done, 10 cannot write, 11 lock, 12 import failed, 13 bad output, 14 no srun, 15 interrupted.
set -u
target=$1 uri=$2 force=$3 cache=$4 data=$5
shift 5
dir=$(dirname -- "$target")
part=$target.part
lock=$target.lock
held=0
job=
watch=

trap '' PIPE # the client may be gone: a failed write must not stop the clean-up
say() { printf 'ckpteval-squash: %s\n' "$*"; }
fail() {
  local code=$1
  shift
  printf 'ckpteval-squash: error: %s\n' "$*" >&2
  exit "$code"
}
cleanup() {
  [ -n "$watch" ] && kill "$watch" 2>/dev/null
  if [ "$held" = 1 ]; then
    rm -f -- "$part" "$lock"
  fi
}
interrupted() {
  if [ -n "$job" ]; then
    kill -TERM "$job" 2>/dev/null
    wait "$job" 2>/dev/null
  fi
  exit 15
}
trap cleanup EXIT
trap interrupted TERM INT HUP

command -v "$1" >/dev/null 2>&1 || fail 14 "'$1' is not available on $(hostname): is this a Slurm login node?"
mkdir -p -- "$dir" 2>/dev/null || fail 10 "cannot create $dir"
[ -w "$dir" ] || fail 10 "cannot write to $dir"
mkdir -p -- "$cache" "$data" 2>/dev/null || fail 10 "cannot create the enroot cache $cache"
exec 9>>"$lock" || fail 10 "cannot create the lock file $lock"

# Lock TARGET.lock. Its holder deletes it before releasing it, so after the lock is granted,
# check that the file locked is still the one at that path; if not, lock the new one.
while :; do
  if ! flock -n 9; then
    say "waiting for another invocation that is importing this image (lock $lock)"
    flock 9 || fail 11 "cannot lock $lock"
  fi
  [ "$(stat -c %d:%i -- "$lock" 2>/dev/null)" = "$(stat -L -c %d:%i /dev/fd/9)" ] && break
  exec 9>>"$lock" || fail 10 "cannot create the lock file $lock"
done
held=1

if [ "$force" != 1 ] && [ -s "$target" ]; then
  say "present $target"
  exit 0
fi
rm -f -- "$part" # left by an import that was killed outright

export ENROOT_CACHE_PATH=$cache ENROOT_DATA_PATH=$data
say "importing $uri"
# a builtin `read` loop (no child process) that ends when stdin does, i.e. when the client is gone
exec 3<&0
(exec 9>&-; while read -r _ <&3; do :; done; kill -TERM $$) &
watch=$!
exec 3<&-
"$@" enroot import --output "$part" -- "$uri" </dev/null &
job=$!
wait "$job"
rc=$?
job=
[ "$rc" = 0 ] || fail 12 "enroot import failed (exit $rc)"
[ "$(head -c 4 -- "$part" 2>/dev/null)" = hsqs ] || fail 13 "enroot import left no squashfs image at $part"
mv -f -- "$part" "$target" || fail 10 "cannot move $part to $target"
say "imported $target $(stat -c %s -- "$target")"
