#!/usr/bin/env bash
# Bring up the integration-test cluster on this machine (Debian 12, as root, no systemd needed):
#
#   * a real Slurm 22.05 cluster: slurmctld + 3 slurmd (node0..node2, 8 fake GPUs each, partition
#     "batch"), accounting through slurmdbd + MariaDB (nemo-run reads job states from sacct);
#   * a real sshd on 127.0.0.1:$SSH_PORT with key auth for $CI_USER and root, `ssh` CLI known_hosts
#     entries and ~/.ssh/config aliases (one of them reached through a ProxyJump hop);
#   * stand-ins for the two NVIDIA tools no package provides: a pyxis SPANK plugin
#     (fake_pyxis.c) and `enroot` (fake-enroot) on the remote PATH; and for the NeMo image's
#     Export-Deploy entry point (export-deploy/, installed under /opt/Export-Deploy);
#   * $CI_INFRA_DIR/infra.json and infra.env: what tests need (host, port, user, key, paths).
#
# Idempotent: what is installed and running is left alone (a re-run with everything up takes ~5 s).
# Stop everything with teardown.sh. Every daemon listens on 127.0.0.1 only.
#
# The project directory ($PROJECT_DIR, default: the repository this script is in) and the
# interpreter its venv links to are made reachable by $CI_USER, because jobs submitted as $CI_USER
# run the project's .venv/bin/python: each directory from / down to them gets o+x (search only, no
# listing), and nothing else is changed. What was changed is printed. `setup.sh project` does only
# this step (for a venv created after the cluster came up; the integration-test fixture runs it).
#
# Environment: CI_INFRA_DIR (/tmp/ci-infra), SSH_PORT (2222), CI_USER (ciuser), FAKE_GPUS (8),
#              PROJECT_DIR (this repository).
set -euo pipefail

INFRA=${CI_INFRA_DIR:-/tmp/ci-infra}
SSH_PORT=${SSH_PORT:-2222}
CI_USER=${CI_USER:-ciuser}
NGPU=${FAKE_GPUS:-8}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROJECT_DIR=${PROJECT_DIR:-$(cd "$HERE/../.." && pwd)}
NODES=(node0 node1 node2)
ACCOUNT=ciaccount
PARTITION=batch
export DEBIAN_FRONTEND=noninteractive

T0=$(date +%s)
say() { printf '[infra %3ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
die() { printf '[infra] error: %s\n' "$*" >&2; exit 1; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
waitfor() { # waitfor SECONDS WHAT COMMAND... : poll every 0.25 s
  local tries=$(($1 * 4)) what=$2
  shift 2
  for _ in $(seq "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  die "timed out after ${tries}/4 s waiting for $what"
}
# write_if_changed PATH: stdin -> PATH, only when different; returns 0 if the file changed
write_if_changed() {
  local tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 1; fi
  mv "$tmp" "$1"
  chmod 644 "$1"
  return 0
}

PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd libslurm-dev mariadb-server
  openssh-server openssh-client rsync squashfs-tools util-linux gcc libc6-dev python3.11 procps)

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "apt-get install ${missing[*]}"
  apt-get update -qq >"$INFRA/apt.log" 2>&1 || { tail -20 "$INFRA/apt.log"; die "apt-get update failed"; }
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$INFRA/apt.log" 2>&1 \
    || { tail -30 "$INFRA/apt.log"; die "apt-get install failed (log: $INFRA/apt.log)"; }
}

start_munge() {
  # the munge postinst creates a key; a stripped image may not have run it
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  alive /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged
  waitfor 10 munged sh -c 'munge -n | unmunge'
}

start_mariadb() {
  install -d -o mysql -g mysql /run/mysqld
  if ! mariadb -e 'select 1' >/dev/null 2>&1; then
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >"$INFRA/mariadb-install.log" 2>&1
    # mariadbd does not daemonize itself; setsid keeps it out of this script's session
    setsid /usr/sbin/mariadbd --user=mysql --skip-networking --socket=/run/mysqld/mysqld.sock \
      --innodb-buffer-pool-size=64M >"$INFRA/mariadbd.log" 2>&1 </dev/null &
    echo $! >"$INFRA/mariadbd.pid"
    waitfor 60 mariadbd mariadb -e 'select 1'
  fi
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmdbpass';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
}

start_slurmdbd() {
  install -d -o slurm -g slurm /run/slurm /var/log/slurm /var/spool/slurmctld
  # slurmdbd refuses a config that is not owned by SlurmUser with mode 600
  write_if_changed /etc/slurm/slurmdbd.conf <<'EOF' || true
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=slurm
PidFile=/run/slurm/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=slurmdbpass
EOF
  chown slurm:slurm /etc/slurm/slurmdbd.conf
  chmod 600 /etc/slurm/slurmdbd.conf
  alive /run/slurm/slurmdbd.pid || /usr/sbin/slurmdbd
  waitfor 30 slurmdbd bash -c 'exec 3<>/dev/tcp/127.0.0.1/6819'
}

slurm_conf() {
  cat <<EOF
ClusterName=localcluster
SlurmctldHost=localhost
AuthType=auth/munge
CredType=cred/munge
SlurmUser=slurm
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
# nodes may claim more CPUs/memory than this VM has: a DGX-like shape (64 CPUs, 500 GB, 8 GPUs),
# otherwise realistic requests stay PENDING forever (Reason=PartitionConfig) instead of failing
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
GresTypes=gpu
EOF
  local i=0
  for n in "${NODES[@]}"; do
    # one slurmd per node on its own port; NodeAddr is the same loopback for all
    echo "NodeName=$n NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=512000 Gres=gpu:$NGPU State=UNKNOWN"
    i=$((i + 1))
  done
  echo "PartitionName=$PARTITION Nodes=node[0-$((${#NODES[@]} - 1))] Default=YES MaxTime=INFINITE State=UP"
}

configure_slurm() {
  # a GPU gres needs device files; character devices equivalent to /dev/null are accepted
  for i in $(seq 0 $((NGPU - 1))); do [ -e "/dev/fakegpu$i" ] || mknod -m 666 "/dev/fakegpu$i" c 1 3; done
  local changed=0
  slurm_conf | write_if_changed /etc/slurm/slurm.conf && changed=1
  printf 'AutoDetect=off\nNodeName=node[0-%d] Name=gpu File=/dev/fakegpu[0-%d]\n' \
    $((${#NODES[@]} - 1)) $((NGPU - 1)) | write_if_changed /etc/slurm/gres.conf && changed=1
  install -d /etc/slurm/plugstack.conf.d
  # "required": with "optional" a plugin error is ignored and the task runs anyway
  echo 'required /usr/local/lib/slurm/fake_pyxis.so' | write_if_changed /etc/slurm/plugstack.conf.d/fake_pyxis.conf && changed=1
  if [ $changed = 1 ] && alive /run/slurm/slurmctld.pid; then
    say "slurm config changed: restarting slurm daemons"
    stop_slurm
  fi
}

stop_slurm() {
  local f
  for f in /run/slurm/slurmd-*.pid /run/slurm/slurmctld.pid; do
    alive "$f" || continue
    kill "$(cat "$f")"
    waitfor 20 "$(basename "$f" .pid) to stop" bash -c "! kill -0 $(cat "$f")"
  done
}

build_fake_pyxis() {
  local so=/usr/local/lib/slurm/fake_pyxis.so
  if [ ! -f "$so" ] || [ "$HERE/fake_pyxis.c" -nt "$so" ]; then
    install -d /usr/local/lib/slurm
    gcc -shared -fPIC -O2 -Wall -Werror -o "$so.tmp" "$HERE/fake_pyxis.c"
    mv "$so.tmp" "$so"
    # running slurmd load plugins at task launch, so a rebuilt plugin takes effect at once
  fi
}

start_slurm() {
  local fresh=0
  alive /run/slurm/slurmctld.pid || { /usr/sbin/slurmctld; fresh=1; }
  waitfor 30 slurmctld scontrol ping
  if [ "$fresh" = 1 ]; then
    # slurmctld recovers the jobs of its previous life from its state directory (a machine image
    # taken while jobs ran, a reboot): their processes are gone, but they would hold nodes and GPUs
    # forever. Cancel them; the job id counter (and so sacct's history) stays consistent.
    local stale
    stale=$(squeue -h -o %i | tr '\n' ' ')
    if [ -n "${stale// /}" ]; then
      say "cancelling jobs recovered from a previous slurmctld: $stale"
      # shellcheck disable=SC2086
      scancel $stale || true
    fi
  fi
  for n in "${NODES[@]}"; do
    install -d "/var/spool/slurmd/$n"
    alive "/run/slurm/slurmd-$n.pid" || /usr/sbin/slurmd -N "$n"
  done
  [ "$fresh" = 1 ] && waitfor 60 "stale jobs to leave the queue" bash -c '[ -z "$(squeue -h -o %i)" ]'
  # a node that went DOWN (e.g. after a crash) comes back with ReturnToService=2 once it registers
  waitfor 60 "${#NODES[@]} idle nodes" bash -c \
    "[ \"\$(sinfo -h -N -o '%T' | grep -cE '^(idle|mixed|allocated)$')\" = ${#NODES[@]} ]"
  # slurmctld registers the cluster in slurmdbd by itself
  waitfor 30 "cluster in slurmdbd" bash -c 'sacctmgr -n -P list cluster format=cluster | grep -qx localcluster'
}

install_fake_enroot() {
  install -D -m 0755 "$HERE/fake-enroot" /opt/fake-enroot/bin/enroot
  # the call log is shared by every user and test: append-only use, world-writable
  touch "$INFRA/enroot-calls.log"
  chmod 666 "$INFRA/enroot-calls.log"
}

# The NeMo image's Export-Deploy entry point, where the fake pyxis finds it (a step sees the node's own
# filesystem): a stand-in that takes the real script's arguments and serves through Ray Serve (see its
# docstring). Copied, not linked, so it does not depend on which checkout ran this.
install_export_deploy_stand_in() {
  install -D -m 0755 "$HERE/export-deploy/scripts/deploy/llm/mlm/deploy_ray.py" \
    /opt/Export-Deploy/scripts/deploy/llm/mlm/deploy_ray.py
  # node names resolve, as on a real cluster (Ray workers join the head at $PRIMARY_NODE:6379)
  getent hosts "${NODES[0]}" >/dev/null || echo "127.0.0.1 ${NODES[*]}" >>/etc/hosts
}

create_user_and_keys() {
  id "$CI_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$CI_USER"
  # useradd leaves the account locked ("!"), which sshd refuses with UsePAM no; "*" = no password
  usermod -p '*' "$CI_USER"
  [ -f "$INFRA/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$INFRA/ssh_host_ed25519_key" -C ci-host
  [ -f "$INFRA/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$INFRA/id_ed25519" -C ci-client
  local home
  for user in root "$CI_USER"; do
    home=$(getent passwd "$user" | cut -d: -f6)
    install -d -m 700 -o "$user" -g "$(id -gn "$user")" "$home/.ssh"
    touch "$home/.ssh/authorized_keys"
    grep -qxF "$(cat "$INFRA/id_ed25519.pub")" "$home/.ssh/authorized_keys" \
      || cat "$INFRA/id_ed25519.pub" >>"$home/.ssh/authorized_keys"
    chown "$user:" "$home/.ssh/authorized_keys"
    chmod 600 "$home/.ssh/authorized_keys"
  done
}

start_sshd() {
  install -d -m 755 /run/sshd
  write_if_changed "$INFRA/sshd_config" <<EOF || true
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $INFRA/ssh_host_ed25519_key
PidFile $INFRA/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile .ssh/authorized_keys
# ProxyJump tests hop through this same sshd
AllowTcpForwarding yes
Subsystem sftp /usr/lib/openssh/sftp-server
MaxStartups 100:30:200
MaxSessions 50
LogLevel VERBOSE
# the "remote PATH": the fake enroot is found by every ssh session and every job it submits
SetEnv PATH=/opt/fake-enroot/bin:/usr/local/bin:/usr/bin:/bin FAKE_ENROOT_LOG=$INFRA/enroot-calls.log
EOF
  /usr/sbin/sshd -t -f "$INFRA/sshd_config"
  if alive "$INFRA/sshd.pid"; then
    kill -HUP "$(cat "$INFRA/sshd.pid")" # re-read the config (a no-op when unchanged)
  else
    /usr/sbin/sshd -f "$INFRA/sshd_config" -E "$INFRA/sshd.log"
  fi
  waitfor 10 sshd bash -c "exec 3<>/dev/tcp/127.0.0.1/$SSH_PORT"
}

configure_ssh_client() {
  # known_hosts for the ssh CLI (nemo-run's rsync uses it): the same key under both names
  local kh="$INFRA/known_hosts" h line
  : >"$kh.tmp"
  for h in 127.0.0.1 localhost; do
    line=$(awk -v h="[$h]:$SSH_PORT" '{print h, $1, $2}' "$INFRA/ssh_host_ed25519_key.pub")
    echo "$line" >>"$kh.tmp"
  done
  mv "$kh.tmp" "$kh"
  chmod 644 "$kh"
  install -d -m 700 /root/.ssh
  touch /root/.ssh/known_hosts
  while read -r line; do
    h=${line%% *}
    # drop a stale key for the same name (the host key is regenerated after a machine reset)
    ssh-keygen -R "$h" -f /root/.ssh/known_hosts >/dev/null 2>&1 || true
    echo "$line" >>/root/.ssh/known_hosts
  done <"$kh"
  rm -f /root/.ssh/known_hosts.old
  # aliases: direct, and the same login node reached through a bastion (a second hop through
  # this sshd), so ProxyJump is exercised for real
  cat >"$INFRA/ssh_config" <<EOF
Host slurm-local
    HostName 127.0.0.1
    Port $SSH_PORT
    User $CI_USER
    IdentityFile $INFRA/id_ed25519
    IdentitiesOnly yes

Host slurm-bastion
    HostName 127.0.0.1
    Port $SSH_PORT
    User $CI_USER
    IdentityFile $INFRA/id_ed25519
    IdentitiesOnly yes

Host slurm-behind-bastion
    HostName 127.0.0.1
    Port $SSH_PORT
    User $CI_USER
    IdentityFile $INFRA/id_ed25519
    IdentitiesOnly yes
    ProxyJump slurm-bastion
EOF
  chmod 644 "$INFRA/ssh_config"
  touch /root/.ssh/config
  chmod 600 /root/.ssh/config
  # our block in root's config, between markers, replaced on every run
  local begin="# >>> ckpteval test infra ($INFRA) >>>" end="# <<< ckpteval test infra <<<"
  awk -v b="$begin" -v e="$end" '$0==b{skip=1} !skip{print} $0==e{skip=0}' /root/.ssh/config >/root/.ssh/config.tmp
  { cat /root/.ssh/config.tmp; echo "$begin"; cat "$INFRA/ssh_config"; echo "$end"; } >/root/.ssh/config
  rm -f /root/.ssh/config.tmp
}

# traversable DIR WHY: give DIR and each directory above it the search bit for others (o+x: pass
# through, not list) where it lacks it, and print each change
traversable() {
  local d=$1
  while [ "$d" != / ] && [ "$d" != . ]; do
    if [ "$(( $(stat -c '%a' "$d" | sed 's/^/0/') & 1 ))" = 0 ]; then
      chmod o+x "$d"
      say "made $d traversable by others (o+x) so $CI_USER can reach $2"
    fi
    d=$(dirname "$d")
  done
}

make_project_traversable() {
  # jobs run as $CI_USER import from $PROJECT_DIR/src and execute $PROJECT_DIR/.venv/bin/python,
  # a symlink to whichever Python 3.11 uv found (Debian's /usr/bin/python3.11, a pyenv build or a
  # uv-managed one, both under root's 0700 home by default): the directories above the project,
  # above each link of that symlink chain, and above the interpreter's install tree (its stdlib)
  # need the search bit for others. The install tree itself is world-readable as installed.
  traversable "$PROJECT_DIR" "$PROJECT_DIR"
  local venv_python=$PROJECT_DIR/.venv/bin/python p target prefix
  [ -L "$venv_python" ] || [ -e "$venv_python" ] || return 0 # no venv yet: the test fixture calls us again
  p=$venv_python
  while [ -L "$p" ]; do
    target=$(readlink "$p")
    case $target in /*) p=$target ;; *) p=$(dirname "$p")/$target ;; esac
    traversable "$(dirname "$p")" "$venv_python"
  done
  p=$(readlink -f "$venv_python")
  traversable "$(dirname "$p")" "$venv_python"
  prefix=$("$venv_python" -c 'import sys; print(sys.base_prefix)') \
    || die "$venv_python does not run (recreate the venv: rm -rf $PROJECT_DIR/.venv && uv sync)"
  traversable "$prefix" "the standard library under $prefix"
  runuser -u "$CI_USER" -- "$venv_python" -c 'import sys' \
    || die "$CI_USER cannot run $venv_python (its interpreter $p, under $prefix): make that install tree readable by others (chmod -R o+rX $prefix), or recreate the venv with another Python 3.11 (rm -rf $PROJECT_DIR/.venv && UV_PYTHON=/usr/bin/python3.11 uv sync)"
}

write_env_files() {
  local home
  home=$(getent passwd "$CI_USER" | cut -d: -f6)
  python3.11 - "$INFRA" <<EOF
import json, os, shlex, sys
infra = sys.argv[1]
info = {
    "infra_dir": infra,
    "ssh_host": "127.0.0.1",
    "ssh_port": $SSH_PORT,
    "ssh_user": "$CI_USER",
    "ssh_key": f"{infra}/id_ed25519",
    "ssh_known_hosts": f"{infra}/known_hosts",
    "ssh_config": f"{infra}/ssh_config",
    "ssh_alias": "slurm-local",
    "ssh_alias_proxyjump": "slurm-behind-bastion",
    "ssh_log": f"{infra}/sshd.log",
    "user_home": "$home",
    "slurm_account": "$ACCOUNT",
    "slurm_partition": "$PARTITION",
    "slurm_nodes": ${#NODES[@]},
    "gpus_per_node": $NGPU,
    "enroot_bin_dir": "/opt/fake-enroot/bin",
    "enroot_log": f"{infra}/enroot-calls.log",
}
tmp = f"{infra}/infra.json.tmp"
with open(tmp, "w") as f:
    json.dump(info, f, indent=2)
    f.write("\n")
os.replace(tmp, f"{infra}/infra.json")
with open(f"{infra}/infra.env.tmp", "w") as f:
    for k, v in info.items():
        f.write(f"CI_{k.upper()}={shlex.quote(str(v))}\n")
os.replace(f"{infra}/infra.env.tmp", f"{infra}/infra.env")
EOF
  chmod 644 "$INFRA/infra.json" "$INFRA/infra.env"
}

smoke_test() {
  # submit over ssh as $CI_USER, wait (polling squeue is faster than sbatch --wait), check sacct
  local j
  for args in "--gres=gpu:$NGPU" "-N${#NODES[@]} --ntasks-per-node=8 --gpus-per-node=$NGPU --mem=100G"; do
    # shellcheck disable=SC2086
    j=$(ssh -o BatchMode=yes slurm-local sbatch --parsable -A "$ACCOUNT" -o /dev/null $args --wrap "'srun true'")
    waitfor 60 "smoke job $j" bash -c "[ -z \"\$(squeue -h -j $j)\" ]"
    waitfor 30 "smoke job $j in sacct" bash -c "sacct -n -X -P -j $j -o State | grep -qx COMPLETED"
  done
  ssh -o BatchMode=yes slurm-behind-bastion true
  ssh -o BatchMode=yes slurm-local enroot version >/dev/null
}

main() {
  [ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts daemons)"
  if [ "${1:-}" = project ]; then
    # only the project step, for a venv made after the cluster came up (the test fixture runs it)
    make_project_traversable
    return
  fi
  mkdir -p "$INFRA"
  chmod 755 "$INFRA"
  say "packages";       install_packages
  say "munge";          start_munge
  say "mariadb";        start_mariadb
  say "slurmdbd";       start_slurmdbd
  say "fake pyxis";     build_fake_pyxis
  say "slurm config";   configure_slurm
  say "slurm daemons";  start_slurm
  say "fake enroot";    install_fake_enroot
  say "export-deploy";  install_export_deploy_stand_in
  say "ssh user+keys";  create_user_and_keys
  say "sshd";           start_sshd
  say "ssh client";     configure_ssh_client
  say "project dir";    make_project_traversable
  say "env files";      write_env_files
  say "smoke test";     smoke_test
  say "ready: slurm partition $PARTITION (${NODES[*]}, gpu:$NGPU each), sshd 127.0.0.1:$SSH_PORT user $CI_USER, key $INFRA/id_ed25519; details in $INFRA/infra.json"
}

main "$@"
