# A real one-node Slurm cluster for the tests: Debian's munged, slurmctld and slurmd, with their
# own key, config, state, spool and logs under one directory, on free loopback ports. Sourced:
#   slurm_cluster_start DIR     starts it, exports SLURM_CONF; returns 77 where it cannot run
#   slurm_cluster_stop          cancels every job, stops the daemons, removes DIR
# Needs root (slurmd runs jobs as their submitter and must be able to become anyone).

slurm_cluster_dir=

# A TCP port nothing listens on now.
slurm_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

slurm_cluster_start() {
  local dir=$1
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: a Slurm cluster needs root" >&2
    return 77
  fi
  local tool
  for tool in munged slurmctld slurmd sbatch scontrol squeue scancel; do
    command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed (Debian: munge slurmctld slurmd slurm-client)" >&2; return 77; }
  done
  slurm_cluster_dir=$dir
  mkdir -p "$dir"/{munge,state,spool,log}
  chmod 700 "$dir/munge"
  # munged refuses a key others can read; a fresh random one per cluster.
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 400 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" \
         --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/seed" --log-file="$dir/log/munged.log" ||
    { echo "FAIL: munged did not start; $(tail -n 3 "$dir/log/munged.log" 2>/dev/null)" >&2; return 1; }

  local host ctld_port slurmd_port
  host=$(hostname -s)           # slurmctld accepts only its own name as SlurmctldHost
  ctld_port=$(slurm_free_port)
  slurmd_port=$(slurm_free_port)
  # cred_expire: Slurm holds a requeued job for cred_expire + 1 s (120 s by default) before it may
  # start again; sched_interval/bf_interval: the scheduler looks for work every second, not every
  # minute. Everything else is a plain cluster without cgroups or accounting.
  cat >"$dir/slurm.conf" <<EOF
ClusterName=elastictest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket,cred_expire=5
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=3600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=elastic Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -c -f "$SLURM_CONF" ||
    { echo "FAIL: slurmctld did not start; $(tail -n 5 "$dir/log/slurmctld.log" 2>/dev/null)" >&2; return 1; }
  slurmd -f "$SLURM_CONF" ||
    { echo "FAIL: slurmd did not start; $(tail -n 5 "$dir/log/slurmd.log" 2>/dev/null)" >&2; return 1; }
  local _
  for _ in $(seq 1 100); do
    sinfo -h -o '%t' 2>/dev/null | grep -qx idle && return 0
    sleep 0.2
  done
  echo "FAIL: the node never became idle: $(sinfo 2>&1)" >&2
  tail -n 5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2
  return 1
}

slurm_stop_pidfile() {
  local file=$1 pid _
  pid=$(cat "$file" 2>/dev/null) || return 0
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

slurm_cluster_stop() {
  [ -n "$slurm_cluster_dir" ] || return 0
  local dir=$slurm_cluster_dir _
  if [ -f "$dir/slurmctld.pid" ]; then
    scancel --full --signal=KILL --partition=elastic 2>/dev/null
    scancel --partition=elastic 2>/dev/null
    for _ in $(seq 1 50); do
      [ -z "$(squeue -h -t RUNNING,COMPLETING 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  slurm_stop_pidfile "$dir/slurmd.pid"
  slurm_stop_pidfile "$dir/slurmctld.pid"
  munged --stop --socket="$dir/munge/socket" >/dev/null 2>&1 || slurm_stop_pidfile "$dir/munge/munged.pid"
  rm -rf "$dir"
  slurm_cluster_dir=
}
