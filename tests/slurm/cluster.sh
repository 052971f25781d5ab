#!/usr/bin/env bash
# A real single-node SLURM with accounting (Debian packages), for testing workflow/profiles/slurm for
# real: munged, MariaDB (socket only), slurmdbd, slurmctld, slurmd with one fake GPU.
# Usage: tests/slurm/cluster.sh start|stop   (root; `start` installs the packages if missing)
# Facts and gotchas: ../shared/design/SLURM.md. State, spool, pid and log files live under $SCRATCH.
set -euo pipefail
SCRATCH=${SLURM_SCRATCH:-/tmp/fedmedbench-slurm}
HOST=$(hostname -s)
PACKAGES="slurmctld slurmd slurm-client munge slurmdbd mariadb-server"
BINARIES="munged slurmctld slurmd sbatch sacct sacctmgr slurmdbd mariadbd mariadb-install-db"
DB_SOCKET=/run/mysqld/mysqld.sock
DB_PID=/run/mysqld/mysqld.pid
MUNGE_PID=/run/munge/munged.pid

have_binaries() {
  local b
  for b in $BINARIES; do command -v "$b" >/dev/null || return 1; done
}

install() {
  have_binaries && return 0
  [ "$(id -u)" = 0 ] || { echo "cluster.sh: the SLURM packages are missing and installing them needs root" >&2; return 1; }
  echo "Installing $PACKAGES"
  export DEBIAN_FRONTEND=noninteractive
  # The packages must not start their daemons (with their own configs): this script starts them.
  local policy=""
  [ -e /usr/sbin/policy-rc.d ] || { policy=/usr/sbin/policy-rc.d; printf '#!/bin/sh\nexit 101\n' > $policy; chmod +x $policy; }
  local log=$SCRATCH/log/apt.log status=0
  { apt-get install -y -q --no-install-recommends $PACKAGES \
      || { apt-get update -q && apt-get install -y -q --no-install-recommends $PACKAGES; }; } > "$log" 2>&1 || status=$?
  [ -z "$policy" ] || rm -f "$policy"
  if [ $status -ne 0 ] || ! have_binaries; then
    tail -n 40 "$log" >&2
    echo "cluster.sh: installing $PACKAGES failed (full log: $log)" >&2
    return 1
  fi
}

wait_for() {  # wait_for <seconds> <what> <command...>
  local seconds=$1 what=$2
  shift 2
  for _ in $(seq "$seconds"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "cluster.sh: $what did not come up within ${seconds}s; logs in $SCRATCH/log" >&2
  return 1
}

daemon_pid() {  # daemon_pid <name> <pid file>: print the pid if that daemon is alive (not a stale file)
  local pid
  [ -s "$2" ] || return 1
  pid=$(cat "$2")
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && echo "$pid"
}

start() {
  mkdir -p "$SCRATCH"/{state,spool,log}
  install
  grep -q "[[:space:]]$HOST\$" /etc/hosts || echo "127.0.0.1 $HOST" >> /etc/hosts
  mkdir -p /etc/slurm /run/munge /run/mysqld
  chown munge:munge /run/munge
  chown mysql:mysql /run/mysqld
  [ -f /etc/munge/munge.key ] || mungekey -c 2>/dev/null || /usr/sbin/create-munge-key -f
  daemon_pid munged $MUNGE_PID >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged
  wait_for 10 munged munge -n

  # Accounting database: MariaDB on its socket only (no TCP), then slurmdbd.
  touch "$SCRATCH/log/mariadb.log" && chown mysql:mysql "$SCRATCH/log/mariadb.log"
  if ! daemon_pid mariadbd $DB_PID >/dev/null; then
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >> "$SCRATCH/log/mariadb.log" 2>&1
    mariadbd --user=mysql --skip-networking --socket=$DB_SOCKET --pid-file=$DB_PID \
      --datadir=/var/lib/mysql --log-error="$SCRATCH/log/mariadb.log" </dev/null >/dev/null 2>&1 &
  fi
  wait_for 60 MariaDB mariadb --socket=$DB_SOCKET -e "SELECT 1"
  mariadb --socket=$DB_SOCKET -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'fedmedbench';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  cat > "$SCRATCH/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=fedmedbench
PidFile=$SCRATCH/slurmdbd.pid
LogFile=$SCRATCH/log/slurmdbd.log
CONF
  chmod 600 "$SCRATCH/slurmdbd.conf"
  ln -sf "$SCRATCH/slurmdbd.conf" /etc/slurm/slurmdbd.conf

  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  cpus=$(nproc)
  # AccountingStorageTRES: accounting records the GPU each job held; job_comment: and the comment the
  # executor plugin gives each job (rule_<rule>_wildcards_...), so the test can tell training jobs.
  cat > "$SCRATCH/slurm.conf" <<CONF
ClusterName=fedmedbench
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
MinJobAge=300
StateSaveLocation=$SCRATCH/state
SlurmdSpoolDir=$SCRATCH/spool
SlurmctldPidFile=$SCRATCH/slurmctld.pid
SlurmdPidFile=$SCRATCH/slurmd.pid
SlurmctldLogFile=$SCRATCH/log/slurmctld.log
SlurmdLogFile=$SCRATCH/log/slurmd.log
NodeName=$HOST CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem Gres=gpu:1 State=UNKNOWN
PartitionName=main Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
  # A fake GPU needs a device file, else the node is drained.
  echo "NodeName=$HOST Name=gpu File=/dev/null" > "$SCRATCH/gres.conf"
  ln -sf "$SCRATCH/slurm.conf" /etc/slurm/slurm.conf   # the jobstep plugin clears SLURM_CONF
  ln -sf "$SCRATCH/gres.conf" /etc/slurm/gres.conf

  daemon_pid slurmdbd "$SCRATCH/slurmdbd.pid" >/dev/null || slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  # The cluster, and root's account and association (the test submits with slurm_account=root).
  [ -n "$(sacctmgr -n -P list cluster fedmedbench format=Cluster)" ] || sacctmgr -i add cluster fedmedbench >/dev/null
  [ -n "$(sacctmgr -n -P list account root format=Account)" ] || sacctmgr -i add account root cluster=fedmedbench >/dev/null
  [ -n "$(sacctmgr -n -P list assoc cluster=fedmedbench user=root account=root format=User)" ] \
    || sacctmgr -i add user root account=root cluster=fedmedbench >/dev/null
  [ -n "$(sacctmgr -n -P list assoc cluster=fedmedbench user=root account=root format=User)" ] \
    || { echo "cluster.sh: no accounting association for root on cluster fedmedbench" >&2; return 1; }

  daemon_pid slurmctld "$SCRATCH/slurmctld.pid" >/dev/null || slurmctld
  daemon_pid slurmd "$SCRATCH/slurmd.pid" >/dev/null || slurmd
  wait_for 60 "the SLURM node" bash -c '[ "$(sinfo -h -N -o %t)" = idle ]'
  wait_for 30 "accounting (sacct)" sacct -n -X -S now
  echo "SLURM up with accounting: node $HOST idle, one fake GPU"
}

stop_daemon() {  # stop_daemon <name> <pid file>: SIGTERM, then wait up to 30 s for it to exit
  local name=$1 pid
  pid=$(daemon_pid "$1" "$2") || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  echo "cluster.sh: $name (pid $pid) did not stop" >&2
  return 1
}

stop() {
  local failed=0
  scancel --user=root 2>/dev/null || true
  # Reverse start order: the node, the controller, accounting, its database, then munge.
  stop_daemon slurmd "$SCRATCH/slurmd.pid" || failed=1
  stop_daemon slurmctld "$SCRATCH/slurmctld.pid" || failed=1
  stop_daemon slurmdbd "$SCRATCH/slurmdbd.pid" || failed=1
  stop_daemon mariadbd $DB_PID || failed=1
  stop_daemon munged $MUNGE_PID || failed=1
  [ $failed -eq 0 ] && echo "SLURM stopped"
  return $failed
}

"${1:?start|stop}"
