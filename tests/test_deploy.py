#!/usr/bin/python3
"""The deployment examples in examples/deploy say what they claim to say, and their scripts work.

    /usr/bin/python3 tests/test_deploy.py examples/deploy [--elastic-run=PATH]

Checked here, without a cluster:
- every YAML file parses (python3-yaml);
- kubernetes/job.yaml: an Indexed batch/v1 Job, parallelism = completions = the --nnodes upper
  bound, restartPolicy Never, a podFailurePolicy that ignores exit 75 of the trainer container
  and DisruptionTarget conditions, a small backoffLimit, spot nodeSelector and tolerations, a
  termination grace above elastic-run's --grace, a shared PVC for checkpoints and logs, and an
  elastic-run command line that parses into the expected flags;
- kubernetes/etcd.yaml: a Service and a one-replica StatefulSet serving etcd on 2379 with the
  client URLs elastic-run's --rdzv points at;
- kubeflow/component.yaml: the v1 component format, the elastic-run command with its inputs;
  its sh wrapper, run here with a stand-in elastic-run, forwards SIGTERM, keeps exit 75 and
  writes the newest checkpoint to the output; kubeflow/pipeline.py imports without kfp and
  asks for set_retry(5), a spot node selector and toleration;
- slurm/train.sbatch: bash -n (and shellcheck when installed), --requeue, a B:TERM signal; run
  with stand-ins for srun, scontrol and elastic-run (and the real etcd when installed): exit 75
  requeues, SIGTERM to the batch shell reaches elastic-run, failures are not requeued;
- with --elastic-run=PATH (the built launcher): each flag the examples use is in its --help.
`kubectl apply --dry-run=client` needs an API server even for a client-side dry run (it asks for
the resource mapping), so it runs only when ELASTIC_TEST_KUBECTL=1 is set.
Exits 0 when everything holds, 1 with one line per failed check.
"""

import ast
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    print("test_deploy.py needs python3-yaml (Debian: apt-get install python3-yaml)", file=sys.stderr)
    sys.exit(1)

failures = []
notes = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


# elastic-run's options as the examples use them: name -> takes a value.
ELASTIC_RUN_FLAGS = {"--nnodes": True, "--nproc-per-node": True, "--rdzv": True, "--run-id": True,
                     "--log-dir": True, "--grace": True, "--max-restarts": True}


def parse_elastic_run(argv, where):
    """argv starting at elastic-run -> ({flag: value}, trainer argv); unknown flags fail."""
    flags, i = {}, 1
    while i < len(argv) and argv[i] != "--":
        a = argv[i]
        name, eq, val = a.partition("=")
        if not check(name in ELASTIC_RUN_FLAGS, f"{where}: elastic-run option {a!r} is not one of {sorted(ELASTIC_RUN_FLAGS)}"):
            i += 1
            continue
        if not eq:
            i += 1
            if not check(i < len(argv), f"{where}: {name} has no value"):
                break
            val = argv[i]
        check(name not in flags, f"{where}: {name} given twice")
        flags[name] = val
        i += 1
    check(i < len(argv) and argv[i] == "--", f"{where}: no '--' between elastic-run's options and the trainer")
    return flags, argv[i + 1:]


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


# ---------------------------------------------------------------------------------------------
def check_job(root):
    path = os.path.join(root, "kubernetes", "job.yaml")
    docs = load_all(path)
    jobs = by_kind(docs, "Job")
    if not check(len(jobs) == 1, f"{path}: expected one Job, found {len(jobs)}"):
        return
    job = jobs[0]
    check(job.get("apiVersion") == "batch/v1", f"{path}: Job apiVersion is {job.get('apiVersion')}, not batch/v1")
    spec = job["spec"]
    check(spec.get("completionMode") == "Indexed", f"{path}: completionMode is not Indexed")
    check(spec.get("parallelism") == spec.get("completions"), f"{path}: parallelism != completions")
    check(isinstance(spec.get("backoffLimit"), int) and spec["backoffLimit"] <= 6,
          f"{path}: backoffLimit {spec.get('backoffLimit')} is not small")
    pod = spec["template"]["spec"]
    check(pod.get("restartPolicy") == "Never", f"{path}: restartPolicy is not Never (podFailurePolicy requires it)")
    containers = {c["name"]: c for c in pod.get("containers", [])}
    check("trainer" in containers, f"{path}: no container named trainer")

    rules = spec.get("podFailurePolicy", {}).get("rules", [])
    exit75 = [r for r in rules if r.get("action") == "Ignore" and "onExitCodes" in r
              and r["onExitCodes"].get("operator") == "In" and 75 in r["onExitCodes"].get("values", [])]
    check(len(exit75) == 1, f"{path}: no podFailurePolicy rule ignoring exit code 75")
    if exit75:
        check(exit75[0]["onExitCodes"].get("containerName") in containers,
              f"{path}: the exit-75 rule names container {exit75[0]['onExitCodes'].get('containerName')!r}, not one of the pod's")
    disrupted = [r for r in rules if r.get("action") == "Ignore"
                 and any(c.get("type") == "DisruptionTarget" for c in r.get("onPodConditions", []))]
    check(len(disrupted) == 1, f"{path}: no podFailurePolicy rule ignoring DisruptionTarget")
    # An Ignore rule after a FailJob/Count rule for the same exit code would never be reached.
    for r in rules[:rules.index(exit75[0])] if exit75 else []:
        codes = r.get("onExitCodes", {})
        check(not (codes.get("operator") == "In" and 75 in codes.get("values", [])) and
              not (codes.get("operator") == "NotIn" and 75 not in codes.get("values", [])),
              f"{path}: an earlier podFailurePolicy rule catches exit 75 first")

    tolerations = pod.get("tolerations", [])
    keys = {t.get("key") for t in tolerations}
    check("nvidia.com/gpu" in keys, f"{path}: no toleration for nvidia.com/gpu")
    check(any("spot" in (k or "") or "preemptible" in (k or "") for k in keys), f"{path}: no spot/preemptible toleration")
    sel = pod.get("nodeSelector", {})
    check(any("spot" in k or "preemptible" in k for k in sel), f"{path}: nodeSelector does not pick a spot/preemptible pool")

    if "trainer" not in containers:
        return
    c = containers["trainer"]
    argv = list(c.get("command", [])) + list(c.get("args", []))
    if not check(argv and argv[0] == "elastic-run", f"{path}: the trainer container does not run elastic-run"):
        return
    flags, trainer = parse_elastic_run(argv, path)
    check(flags.get("--nnodes") == "2:4", f"{path}: --nnodes is {flags.get('--nnodes')}, not 2:4")
    check(flags.get("--nproc-per-node") == "8", f"{path}: --nproc-per-node is {flags.get('--nproc-per-node')}")
    check(flags.get("--rdzv") == "etcd://elastic-etcd:2379", f"{path}: --rdzv is {flags.get('--rdzv')}")
    check(flags.get("--run-id") == "$(JOB_NAME)", f"{path}: --run-id is {flags.get('--run-id')}")
    check(flags.get("--log-dir") == "/logs", f"{path}: --log-dir is {flags.get('--log-dir')}")
    check(trainer[:1] == ["/opt/trainer"], f"{path}: the trainer after '--' is {trainer[:1]}")
    nmax = int(flags.get("--nnodes", "0:0").split(":")[-1])
    check(spec.get("completions") == nmax, f"{path}: completions {spec.get('completions')} != --nnodes upper bound {nmax}")
    # $(JOB_NAME) is expanded by Kubernetes only from the container's own env.
    env = {e["name"]: e for e in c.get("env", [])}
    check("JOB_NAME" in env, f"{path}: $(JOB_NAME) is used but JOB_NAME is not in the container's env")
    grace = int(flags.get("--grace", "25"))  # elastic-run's default --grace is the loop's 25 s
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    check(tgps >= grace + 5, f"{path}: terminationGracePeriodSeconds {tgps} leaves no margin over --grace {grace}")
    check(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == int(flags.get("--nproc-per-node", 0)),
          f"{path}: GPU limit != --nproc-per-node")

    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    logs = mounts.get("/logs")
    check(logs is not None, f"{path}: /logs is not mounted")
    ckpt_arg = trainer[trainer.index("--ckpt") + 1] if "--ckpt" in trainer[:-1] else None
    check(ckpt_arg is not None, f"{path}: the trainer gets no --ckpt")
    for what, mount_path in (("logs", "/logs"), ("checkpoints", ckpt_arg)):
        m = next((m for p, m in mounts.items() if mount_path and (mount_path + "/").startswith(p.rstrip("/") + "/")), None)
        vol = volumes.get(m["name"]) if m else None
        if check(vol is not None and "persistentVolumeClaim" in vol, f"{path}: the {what} ({mount_path}) are not on a PVC"):
            claim = vol["persistentVolumeClaim"]["claimName"]
            pvcs = [d for d in by_kind(docs, "PersistentVolumeClaim") if d["metadata"]["name"] == claim]
            if pvcs:
                check("ReadWriteMany" in pvcs[0]["spec"].get("accessModes", []),
                      f"{path}: PVC {claim} is not ReadWriteMany, so hosts cannot share it")
    check("/dev/shm" in mounts, f"{path}: no /dev/shm mount (64 MiB default is too small)")
    return flags


def check_etcd(root, job_flags):
    path = os.path.join(root, "kubernetes", "etcd.yaml")
    docs = load_all(path)
    services = by_kind(docs, "Service")
    workloads = by_kind(docs, "StatefulSet") + by_kind(docs, "Deployment")
    check(len(services) == 1 and len(workloads) == 1, f"{path}: expected one Service and one StatefulSet/Deployment")
    if not (services and workloads):
        return
    svc, wl = services[0], workloads[0]
    rdzv = (job_flags or {}).get("--rdzv", "etcd://elastic-etcd:2379")
    host, _, port = rdzv[len("etcd://"):].partition(":")
    check(svc["metadata"]["name"] == host, f"{path}: the Service is {svc['metadata']['name']}, the job's --rdzv names {host}")
    check(any(p.get("port") == int(port) for p in svc["spec"]["ports"]), f"{path}: the Service has no port {port}")
    check(wl["spec"].get("replicas", 1) == 1, f"{path}: not a single etcd member")
    labels = wl["spec"]["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), f"{path}: the Service selector does not match the pods")
    c = wl["spec"]["template"]["spec"]["containers"][0]
    image = c["image"]
    check(any(f":v3.{m}." in image for m in (4, 5)), f"{path}: image {image} is not etcd 3.4/3.5")
    argv = " ".join(list(c.get("command", [])) + list(c.get("args", [])))
    check("--listen-client-urls=http://0.0.0.0:2379" in argv, f"{path}: etcd does not listen on 0.0.0.0:2379")
    check(f"--advertise-client-urls=http://{host}:{port}" in argv, f"{path}: etcd does not advertise http://{host}:{port}")
    tol = wl["spec"]["template"]["spec"].get("tolerations", [])
    check(not any("spot" in (t.get("key") or "") for t in tol), f"{path}: etcd tolerates spot nodes")


# ---------------------------------------------------------------------------------------------
STUB_ELASTIC_RUN = r'''#!/usr/bin/python3
# Stand-in for elastic-run: records its argv, then behaves as $STUB_MODE says.
import json, os, signal, sys, time, urllib.request
d = os.environ["STUB_DIR"]
with open(os.path.join(d, "argv.json"), "w") as f:
    json.dump(sys.argv, f)
rdzv = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--rdzv"), "")
if rdzv.startswith("etcd://") and os.environ.get("STUB_CHECK_ETCD") == "1":
    ep = rdzv[len("etcd://"):].split(",")[0]
    with urllib.request.urlopen(f"http://{ep}/health", timeout=5) as r:
        open(os.path.join(d, "etcd_health"), "w").write(r.read().decode())
mode = os.environ.get("STUB_MODE", "exit:0")
if mode.startswith("exit:"):
    sys.exit(int(mode[5:]))
# "term": wait for the preemption notice, then exit as a preempted elastic-run does.
signal.signal(signal.SIGTERM, lambda *_: (open(os.path.join(d, "got_term"), "w").close(), os._exit(75)))
open(os.path.join(d, "ready"), "w").close()
time.sleep(60)
sys.exit(99)
'''

STUB_SRUN = r'''#!/bin/bash
# Stand-in for srun: skip srun's own options, run the task once here (as node0), exec so that a
# signal to "srun" reaches the task, as srun forwards it.
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
export SLURMD_NODENAME=node0
exec "$@"
'''

STUB_SCONTROL = r'''#!/bin/bash
echo "$*" >> "$STUB_DIR/scontrol"
'''


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def wait_file(path, proc, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def run_bounded(proc, timeout):
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def free_job_id():
    """A job id whose etcd ports (20000 + id % 20000, and +1) are free here, below the ephemeral range."""
    for attempt in range(200):
        port = 20000 + (os.getpid() * 7919 + attempt * 104729) % 12000
        ok = True
        for p in (port, port + 1):
            with socket.socket() as s:
                try:
                    s.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
        if ok:
            return 100000 + (port - 20000)  # % 20000 gives port - 20000
    return None


def check_sbatch(root, tmp):
    path = os.path.join(root, "slurm", "train.sbatch")
    text = open(path).read()
    r = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
    check(r.returncode == 0, f"{path}: bash -n failed: {r.stderr.strip()}")
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", "-s", "bash", path], capture_output=True, text=True)
        check(r.returncode == 0, f"{path}: shellcheck:\n{r.stdout}")
    else:
        notes.append("shellcheck not installed: skipped")
    directives = [l.split(None, 1)[1].strip() for l in text.splitlines() if l.startswith("#SBATCH ")]
    check("--requeue" in directives, f"{path}: no #SBATCH --requeue")
    check(any(d.startswith("--signal=B:TERM@") for d in directives), f"{path}: no #SBATCH --signal=B:TERM@<seconds>")
    check("scontrol requeue" in text, f"{path}: no scontrol requeue")

    stubs = os.path.join(tmp, "stubs")
    os.makedirs(stubs)
    write_exe(os.path.join(stubs, "elastic-run"), STUB_ELASTIC_RUN)
    write_exe(os.path.join(stubs, "srun"), STUB_SRUN)
    write_exe(os.path.join(stubs, "scontrol"), STUB_SCONTROL)
    have_etcd = shutil.which("etcd") is not None and shutil.which("curl") is not None
    if not have_etcd:
        notes.append("etcd or curl not installed: train.sbatch ran against ELASTIC_ETCD=127.0.0.1:1 (not started)")
    job_id = free_job_id()
    if not check(job_id is not None, "no free port pair for the sbatch script's etcd"):
        return

    def run(mode, name, signal_after_ready=False):
        d = os.path.join(tmp, name)
        os.makedirs(d)
        env = dict(os.environ, PATH=stubs + os.pathsep + os.environ["PATH"], STUB_DIR=d, STUB_MODE=mode,
                   STUB_CHECK_ETCD="1" if have_etcd else "0",
                   SLURM_JOB_ID=str(job_id), SLURM_JOB_NUM_NODES="4", SLURM_GPUS_ON_NODE="8",
                   SLURM_RESTART_COUNT="0", TMPDIR=d,
                   ELASTIC_CKPT=os.path.join(d, "ckpt"), ELASTIC_LOGS=os.path.join(d, "logs"))
        if not have_etcd:
            env["ELASTIC_ETCD"] = "127.0.0.1:1"
        p = subprocess.Popen(["bash", path], cwd=d, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        if signal_after_ready:
            if check(wait_file(os.path.join(d, "ready"), p, 30), f"{path} [{name}]: elastic-run never started"):
                p.send_signal(signal.SIGTERM)  # what --signal=B:TERM does: the batch shell only
        rc, out = run_bounded(p, 60)
        check(rc is not None, f"{path} [{name}]: did not end within 60 s:\n{out}")
        sc = open(os.path.join(d, "scontrol")).read().split("\n") if os.path.exists(os.path.join(d, "scontrol")) else []
        argv = json.load(open(os.path.join(d, "argv.json"))) if os.path.exists(os.path.join(d, "argv.json")) else None
        return d, rc, out, [l for l in sc if l], argv

    d, rc, out, sc, argv = run("exit:75", "preempted")
    check(rc == 0 and sc == [f"requeue {job_id}"], f"{path}: on exit 75 expected a requeue and exit 0, got rc {rc}, scontrol {sc}:\n{out}")
    if check(argv is not None, f"{path}: elastic-run was not run:\n{out}"):
        flags, trainer = parse_elastic_run(argv, path + " (as run)")
        check(flags.get("--nnodes") == "2:4", f"{path}: --nnodes {flags.get('--nnodes')} for 4 nodes, expected 2:4")
        check(flags.get("--nproc-per-node") == "8", f"{path}: --nproc-per-node {flags.get('--nproc-per-node')}")
        check((flags.get("--rdzv") or "").startswith("etcd://"), f"{path}: --rdzv {flags.get('--rdzv')}")
        check(flags.get("--run-id") == f"slurm-{job_id}", f"{path}: --run-id {flags.get('--run-id')}")
        check(flags.get("--log-dir") == os.path.join(d, "logs", "node0"), f"{path}: --log-dir {flags.get('--log-dir')}")
        check(trainer[:1] == ["/opt/trainer"], f"{path}: trainer {trainer[:1]}")
        if have_etcd:
            check(os.path.exists(os.path.join(d, "etcd_health")), f"{path}: etcd was not healthy when elastic-run started")
            check(not os.path.exists(os.path.join(d, f"elastic-etcd-{job_id}")), f"{path}: etcd's data directory was left behind")
            port = 20000 + job_id % 20000
            with socket.socket() as s:
                check(s.connect_ex(("127.0.0.1", port)) != 0, f"{path}: etcd still listens on {port} after the job")

    d, rc, out, sc, argv = run("term", "notice", signal_after_ready=True)
    check(os.path.exists(os.path.join(d, "got_term")), f"{path}: SIGTERM to the batch shell did not reach elastic-run:\n{out}")
    check(rc == 0 and sc == [f"requeue {job_id}"], f"{path}: after the notice expected a requeue, got rc {rc}, scontrol {sc}:\n{out}")

    d, rc, out, sc, argv = run("exit:3", "failed")
    check(rc == 3 and not sc, f"{path}: a failure (exit 3) must end the job with 3 and no requeue; got rc {rc}, scontrol {sc}")
    d, rc, out, sc, argv = run("exit:0", "finished")
    check(rc == 0 and not sc, f"{path}: a finished run must exit 0 without requeue; got rc {rc}, scontrol {sc}")


# ---------------------------------------------------------------------------------------------
def placeholder_value(x, inputs, outputs):
    """A v1 component argument with its placeholders filled in for a local run."""
    if isinstance(x, str):
        return x
    if "inputValue" in x:
        return str(inputs[x["inputValue"]])
    if "outputPath" in x:
        return outputs[x["outputPath"]]
    raise ValueError(f"unsupported placeholder {x}")


def check_component(root, tmp):
    path = os.path.join(root, "kubeflow", "component.yaml")
    comp = yaml.safe_load(open(path))
    for key in ("name", "inputs", "outputs", "implementation"):
        check(key in comp, f"{path}: no {key} (KFP v1 component format)")
    c = comp.get("implementation", {}).get("container", {})
    check("image" in c, f"{path}: no container image")
    inputs = {i["name"]: i for i in comp.get("inputs", [])}
    outputs = {o["name"]: o for o in comp.get("outputs", [])}
    args = list(c.get("command", [])) + list(c.get("args", []))
    # Every placeholder names a declared input/output.
    for a in args:
        if isinstance(a, dict):
            (kind, name), = a.items()
            table = inputs if kind == "inputValue" else outputs
            check(name in table, f"{path}: placeholder {a} names no declared {kind[:-5].lower()}put")
    if not check("elastic-run" in args, f"{path}: the container does not run elastic-run"):
        return
    i = args.index("elastic-run")
    values = {n: inp.get("default", f"<{n}>") for n, inp in inputs.items()}
    flags, trainer = parse_elastic_run([placeholder_value(a, values, {"last_checkpoint": "out"}) for a in args[i:]], path)
    for f in ("--nnodes", "--nproc-per-node", "--rdzv", "--run-id", "--log-dir", "--grace"):
        check(f in flags, f"{path}: elastic-run gets no {f}")
    check(trainer[:1] == ["/opt/trainer"], f"{path}: trainer {trainer[:1]}")
    check(c["command"][:2] == ["sh", "-c"], f"{path}: expected an sh -c wrapper")

    # Run the wrapper with a stand-in elastic-run: exit codes pass through, SIGTERM is forwarded,
    # the newest checkpoint is written to the output file.
    stub = os.path.join(tmp, "kfp-elastic-run")
    write_exe(stub, STUB_ELASTIC_RUN)
    for mode, expect in (("exit:0", 0), ("exit:3", 3), ("term", 75)):
        d = os.path.join(tmp, "kfp-" + mode.replace(":", "-"))
        os.makedirs(os.path.join(d, "ckpt", "step-000000000100"))
        os.makedirs(os.path.join(d, "ckpt", "step-000000000200"))
        vals = dict(values, checkpoint_dir=os.path.join(d, "ckpt"), log_dir=os.path.join(d, "logs"), run_id="r")
        out_file = os.path.join(d, "outputs", "last_checkpoint", "data")
        argv = [placeholder_value(a, vals, {"last_checkpoint": out_file}) for a in args]
        argv[argv.index("elastic-run")] = stub
        env = dict(os.environ, STUB_DIR=d, STUB_MODE=mode, STUB_CHECK_ETCD="0")
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        if mode == "term" and check(wait_file(os.path.join(d, "ready"), p, 30), f"{path}: elastic-run never started"):
            p.send_signal(signal.SIGTERM)  # the kubelet signals PID 1: the sh wrapper
        rc, out = run_bounded(p, 30)
        check(rc == expect, f"{path} [{mode}]: the wrapper exited {rc}, expected {expect}:\n{out}")
        got = open(out_file).read() if os.path.exists(out_file) else None
        check(got == os.path.join(d, "ckpt", "step-000000000200"), f"{path} [{mode}]: last_checkpoint output is {got!r}")


def check_pipeline(root):
    path = os.path.join(root, "kubeflow", "pipeline.py")
    src = open(path).read()
    tree = ast.parse(src, path)
    top_imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name.split(".")[0] for n in top_imports for a in n.names} | \
            {n.module.split(".")[0] for n in top_imports if isinstance(n, ast.ImportFrom) and n.module}
    check("kfp" not in names, f"{path}: imports kfp at module level (it must import without kfp)")
    calls = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            calls.setdefault(name, []).append(n)
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              for t in n.targets if isinstance(t, ast.Name)}

    def first_arg(call):
        a = call.args[0] if call.args else None
        if isinstance(a, ast.Constant):
            return a.value
        if isinstance(a, ast.Name):
            return consts.get(a.id)
        return None

    retries = calls.get("set_retry", [])
    check(retries and all(first_arg(c) == 5 for c in retries), f"{path}: not every pipeline asks for set_retry(5)")
    check("add_node_selector" in calls or "use_preemptible_nodepool" in calls, f"{path}: no preemptible node selector")
    check("add_toleration" in calls, f"{path}: no toleration")
    check("mount_pvc" in calls, f"{path}: no PVC for checkpoints")
    # Importable without kfp, and says so when asked to compile.
    r = subprocess.run([sys.executable, "-c", f"import runpy; m = runpy.run_path({path!r}); print(m['COMPONENT'])"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"{path}: does not import without running: {r.stderr.strip()}")
    try:
        import kfp  # noqa: F401
        notes.append("kfp is installed: compiling pipeline.py")
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([sys.executable, path, os.path.join(d, "p.yaml")], capture_output=True, text=True, timeout=120)
            check(r.returncode == 0, f"{path}: compiling failed: {r.stderr[-2000:]}")
    except ImportError:
        notes.append("kfp not installed: pipeline.py checked statically, not compiled")


def check_yaml_parses(root):
    n = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith((".yaml", ".yml")):
                p = os.path.join(dirpath, f)
                try:
                    load_all(p)
                    n += 1
                except yaml.YAMLError as e:
                    check(False, f"{p}: does not parse: {e}")
    check(n >= 3, f"{root}: found only {n} YAML files")


def check_kubectl(root):
    if os.environ.get("ELASTIC_TEST_KUBECTL") != "1":
        notes.append("kubectl dry run skipped (set ELASTIC_TEST_KUBECTL=1 with a reachable API server)")
        return
    kubectl = shutil.which("kubectl")
    if not check(kubectl, "ELASTIC_TEST_KUBECTL=1 but no kubectl"):
        return
    for f in ("etcd.yaml", "job.yaml"):
        r = subprocess.run([kubectl, "apply", "--dry-run=client", "-f", os.path.join(root, "kubernetes", f)],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, f"kubectl apply --dry-run=client -f {f}: {r.stderr.strip()}")


def check_launcher_help(root, launcher):
    if not launcher:
        notes.append("no --elastic-run given: its --help not compared with the flags the examples use")
        return
    if not os.path.exists(launcher):
        notes.append(f"{launcher} not built: its --help not compared")
        return
    r = subprocess.run([launcher, "--help"], capture_output=True, text=True, timeout=30)
    text = r.stdout + r.stderr
    for flag in ELASTIC_RUN_FLAGS:
        check(flag in text, f"{launcher} --help does not mention {flag}, which the deploy examples use")


def main(argv):
    args = [a for a in argv[1:] if a]
    launcher = next((a.split("=", 1)[1] for a in args if a.startswith("--elastic-run=")), None)
    roots = [a for a in args if not a.startswith("--")]
    if len(roots) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(roots[0])
    with tempfile.TemporaryDirectory(prefix="elastic-deploy-test-") as tmp:
        for name, fn in (("yaml", lambda: check_yaml_parses(root)),
                         ("kubernetes", lambda: check_etcd(root, check_job(root))),
                         ("kubeflow component", lambda: check_component(root, tmp)),
                         ("kubeflow pipeline", lambda: check_pipeline(root)),
                         ("slurm", lambda: check_sbatch(root, tmp)),
                         ("kubectl", lambda: check_kubectl(root)),
                         ("elastic-run --help", lambda: check_launcher_help(root, launcher))):
            before = len(failures)
            try:
                fn()
            except Exception as e:  # a malformed file must fail the test, not crash it silently
                failures.append(f"{name}: {type(e).__name__}: {e}")
            print(f"{name}: {'ok' if len(failures) == before else 'FAILED'}")
    for n in notes:
        print(f"note: {n}")
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
