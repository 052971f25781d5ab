#!/usr/bin/env bash
# A real single-node SLURM (Debian packages), for testing workflow/profiles/slurm for real.
# Usage: tests/slurm/cluster.sh start|stop   (root; installs slurmctld slurmd slurm-client munge if missing)
set -euo pipefail
SCRATCH=${SLURM_SCRATCH:-/tmp/fedmedbench-slurm}
HOST=$(hostname -s)

start() {
  command -v slurmctld >/dev/null || apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null
  grep -q " $HOST\$" /etc/hosts || echo "127.0.0.1 $HOST" >> /etc/hosts
  mkdir -p "$SCRATCH"/{state,spool,log} /etc/slurm /run/munge
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
  chown munge:munge /run/munge
  [ -f /etc/munge/munge.key ] || (mungekey -c 2>/dev/null || /usr/sbin/create-munge-key -f)
  pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged
  pgrep -x slurmctld >/dev/null || slurmctld
  pgrep -x slurmd >/dev/null || slurmd
  for _ in $(seq 30); do
    state=$(sinfo -h -N -o %t 2>/dev/null || true)
    [ "$state" = "idle" ] && { echo "SLURM up: node $HOST idle"; return 0; }
    sleep 1
  done
  echo "SLURM did not come up (node state: ${state:-none}); logs in $SCRATCH/log" >&2
  return 1
}

stop() {
  scancel --user=root 2>/dev/null || true
  for pid in "$SCRATCH/slurmd.pid" "$SCRATCH/slurmctld.pid"; do
    [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
  done
}

"${1:?start|stop}"
