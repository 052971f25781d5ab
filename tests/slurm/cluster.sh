#!/usr/bin/env bash
# A real single-node SLURM with accounting (Debian packages), for testing workflow/profiles/slurm for
# real: munged, MariaDB (socket only), slurmdbd, slurmctld, slurmd with one fake GPU.
# Usage: tests/slurm/cluster.sh start|stop   (root; installs the packages if missing)
set -euo pipefail
SCRATCH=${SLURM_SCRATCH:-/tmp/fedmedbench-slurm}
HOST=$(hostname -s)
PACKAGES="slurmctld slurmd slurm-client munge slurmdbd mariadb-server"
DB_SOCKET=/run/mysqld/mysqld.sock

install() {
  command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && return 0
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends $PACKAGES >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $PACKAGES >/dev/null; }
}

wait_for() {  # wait_for <seconds> <what> <command...>
  local seconds=$1 what=$2
  shift 2
  for _ in $(seq "$seconds"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "$what did not come up; logs in $SCRATCH/log" >&2
  return 1
}

start() {
  install
  grep -q " $HOST\$" /etc/hosts || echo "127.0.0.1 $HOST" >> /etc/hosts
  mkdir -p "$SCRATCH"/{state,spool,log} /etc/slurm /run/munge /run/mysqld
  chown munge:munge /run/munge
  chown mysql:mysql /run/mysqld
  [ -f /etc/munge/munge.key ] || (mungekey -c 2>/dev/null || /usr/sbin/create-munge-key -f)
  pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged

  # Accounting database: MariaDB on its socket only, then slurmdbd.
  touch "$SCRATCH/log/mariadb.log" && chown mysql:mysql "$SCRATCH/log/mariadb.log"
  if ! pgrep -x mariadbd >/dev/null; then
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    mariadbd --user=mysql --skip-networking --socket=$DB_SOCKET --pid-file=/run/mysqld/mysqld.pid \
      --datadir=/var/lib/mysql --log-error="$SCRATCH/log/mariadb.log" &
  fi
  wait_for 30 MariaDB mariadb --socket=$DB_SOCKET -e "SELECT 1"
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
AccountingStorageTRES=gres/gpu   # so that accounting records the GPU each job held
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

  pgrep -x slurmdbd >/dev/null || slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  sacctmgr -i add cluster fedmedbench >/dev/null 2>&1 || true
  sacctmgr -i add account root cluster=fedmedbench >/dev/null 2>&1 || true
  sacctmgr -i add user root account=root cluster=fedmedbench >/dev/null 2>&1 || true
  pgrep -x slurmctld >/dev/null || slurmctld
  pgrep -x slurmd >/dev/null || slurmd
  wait_for 30 "the SLURM node" bash -c '[ "$(sinfo -h -N -o %t)" = idle ]'
  echo "SLURM up with accounting: node $HOST idle"
}

stop() {
  scancel --user=root 2>/dev/null || true
  for pid in "$SCRATCH/slurmd.pid" "$SCRATCH/slurmctld.pid" "$SCRATCH/slurmdbd.pid" /run/mysqld/mysqld.pid; do
    [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
  done
  for daemon in slurmd slurmctld slurmdbd mariadbd; do
    for _ in $(seq 20); do pgrep -x $daemon >/dev/null || break; sleep 0.5; done
  done
}

"${1:?start|stop}"
