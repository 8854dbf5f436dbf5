#!/usr/bin/python3
"""The deployment examples in examples/deploy say what they claim to say, and their scripts work.

    /usr/bin/python3 tests/test_deploy.py examples/deploy [--elastic-run=PATH]

Checked here, without a cluster:
- every YAML file parses (python3-yaml);
- every document of kubernetes/*.yaml validates against the Kubernetes API schema of v1.33.1
  (tests/data/kubernetes, strict: no unknown fields), and kubeflow/component.yaml against the
  KFP v1 component schema (tests/data/kubeflow), with python3-jsonschema;
- kubernetes/job.yaml: an Indexed batch/v1 Job, parallelism = completions = the --nnodes upper
  bound, a successPolicy that ends the Job when any one index has succeeded (training ended),
  restartPolicy Never, a podFailurePolicy that ignores exit 75 of the trainer container and
  DisruptionTarget conditions, a small backoffLimit, spot nodeSelector and tolerations, a
  termination grace within the spot pool's notice (GKE: 15 s) and 5 s above elastic-run's
  --grace, a run id per Job incarnation (<job name>-<job uid> from the downward API, at most 64
  characters), checkpoints per Job name in a bucket (gs:// or s3://, the pods running as a
  service account that Workload Identity or IRSA gives the keys; a directory instead must be
  on a ReadWriteMany PVC), a /logs volume, and an elastic-run command line that parses into the
  expected flags;
- kubernetes/etcd.yaml: a Service and a one-replica StatefulSet serving etcd on 2379 with the
  client URLs elastic-run's --rdzv points at;
- kubeflow/component.yaml: the elastic-run command with its inputs, a --grace within the
  notice; its sh wrapper, run here with a stand-in elastic-run, forwards SIGTERM, keeps exit 75
  and writes the newest checkpoint to the output; kubeflow/pipeline.py imports without kfp and
  is run against stand-ins of the KFP 1.8 and 2.x SDKs: retries 5 times with Argo's retryPolicy
  "Always" where the SDK can say so (and warns where it cannot), a spot node selector and
  toleration, the pipeline run's id as run id, checkpoints in a bucket by default;
- slurm/train.sbatch: bash -n (and shellcheck when installed), --requeue, a B:USR1 notice passed
  on by scancel --signal=TERM, never by signalling srun (which SIGKILLs the tasks); the script
  runs on a real Slurm cluster in tests/slurm/test_train_sbatch.sh;
- with --elastic-run=PATH (the built launcher): each flag the examples use is in its --help.
`kubectl apply --dry-run=client` needs an API server even for a client-side dry run (it asks for
the resource mapping), so it runs only when ELASTIC_TEST_KUBECTL=1 is set.
Exits 0 when everything holds, 1 with one line per failed check.
"""

import ast
import json
import os
import re
import shutil
import signal
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
HERE = os.path.dirname(os.path.abspath(__file__))
K8S_SCHEMA = os.path.join(HERE, "data", "kubernetes", "v1.33.1-strict.json")
KFP_SCHEMA = os.path.join(HERE, "data", "kubeflow", "components.json_schema.json")
# How long a spot pool's pods get between the preemption notice and SIGKILL, by the node label
# the Job selects (examples/deploy/README.md has the sources). GKE: graceful node shutdown gives
# non-system pods 15 s of the 30 s notice.
SPOT_NOTICE_S = {"cloud.google.com/gke-spot": 15, "cloud.google.com/gke-preemptible": 15}
GRACE_MARGIN_S = 5      # what elastic-run needs after --grace: SIGKILL stragglers, exit 75
RUN_ID_MAX = 64         # tools/agent/run_id.hpp
UID_LEN = 36            # a Kubernetes uid: 8-4-4-4-12 hex digits


def jsonschema_module():
    try:
        import jsonschema
        return jsonschema
    except ImportError:
        check(False, "the schema checks need python3-jsonschema (Debian: apt-get install python3-jsonschema; "
                     "scripts/lib.sh installs it with the test packages)")
        return None


def schema_errors(validator, doc):
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message[:300]}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def check_schemas(root):
    """Every Kubernetes document against the API schema, the component against KFP's schema."""
    jsonschema = jsonschema_module()
    if jsonschema is None:
        return
    k8s = json.load(open(K8S_SCHEMA))
    n = 0
    for f in sorted(os.listdir(os.path.join(root, "kubernetes"))):
        if not f.endswith((".yaml", ".yml")):
            continue
        path = os.path.join(root, "kubernetes", f)
        for i, doc in enumerate(load_all(path)):
            kind = f"{doc.get('apiVersion')}/{doc.get('kind')}"
            where = f"{path} document {i + 1} ({kind})"
            if not check(kind in k8s["kinds"], f"{where}: no schema for this kind in {K8S_SCHEMA} "
                                               f"(has {sorted(k8s['kinds'])}; regenerate it with make_schema.py)"):
                continue
            schema = dict(k8s["kinds"][kind], definitions=k8s["definitions"])
            errors = schema_errors(jsonschema.Draft7Validator(schema), doc)
            check(not errors, f"{where}: not valid for Kubernetes v1.33.1:\n  " + "\n  ".join(errors))
            n += 1
    check(n >= 5, f"{root}/kubernetes: only {n} documents validated")
    kfp = json.load(open(KFP_SCHEMA))
    path = os.path.join(root, "kubeflow", "component.yaml")
    schema = {"$ref": "#/definitions/ComponentSpec", "definitions": kfp["definitions"]}
    errors = schema_errors(jsonschema.Draft6Validator(schema), yaml.safe_load(open(path)))
    check(not errors, f"{path}: not a valid KFP component:\n  " + "\n  ".join(errors))


def env_vars(text):
    return re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", text)


def label_ref(env_entry):
    """The label an env entry takes from the downward API, or None."""
    path = env_entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
    m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    return m.group(1) if m else None


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
    # The Job must end when training ends, although not every index may ever have run (spot
    # capacity short: 2 of 4 hosts): a success rule met by any one succeeded index.
    completions = spec.get("completions", 1)
    every_index = {None, f"0-{completions - 1}" if completions > 1 else "0"}
    rules = spec.get("successPolicy", {}).get("rules", [])
    check(any(r.get("succeededCount") == 1 and r.get("succeededIndexes") in every_index for r in rules),
          f"{path}: no successPolicy rule 'succeededCount: 1' over all indexes: the Job would wait for all "
          f"{completions} indexes to succeed and stay active after training ended")
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
                 and any(c.get("type") == "DisruptionTarget" and c.get("status", "True") == "True"
                         for c in r.get("onPodConditions", []))]
    check(len(disrupted) == 1, f"{path}: no podFailurePolicy rule ignoring DisruptionTarget=True")
    # An Ignore rule after another rule that catches the same failure first would never be reached.
    for r in rules[:rules.index(exit75[0])] if exit75 else []:
        codes = r.get("onExitCodes", {})
        check(not (codes.get("operator") == "In" and 75 in codes.get("values", [])) and
              not (codes.get("operator") == "NotIn" and 75 not in codes.get("values", [])),
              f"{path}: an earlier podFailurePolicy rule catches exit 75 first")
    for r in rules[:rules.index(disrupted[0])] if disrupted else []:
        check(not any(c.get("type") == "DisruptionTarget" for c in r.get("onPodConditions", [])),
              f"{path}: an earlier podFailurePolicy rule catches DisruptionTarget first")

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
    check(flags.get("--log-dir") == "/logs", f"{path}: --log-dir is {flags.get('--log-dir')}")
    check(trainer[:1] == ["/opt/trainer"], f"{path}: the trainer after '--' is {trainer[:1]}")
    nmax = int(flags.get("--nnodes", "0:0").split(":")[-1])
    check(spec.get("completions") == nmax, f"{path}: completions {spec.get('completions')} != --nnodes upper bound {nmax}")
    env = {e["name"]: e for e in c.get("env", [])}
    # $(VAR) is expanded by Kubernetes only from the container's own env.
    for a in argv:
        for var in env_vars(a):
            check(var in env, f"{path}: $({var}) is used in {a!r} but {var} is not in the container's env")
    # The run id: the same for every pod of the Job and its replacements, new for every
    # incarnation of the Job (re-created under the same name, other --nnodes), <= 64 characters.
    run_id = flags.get("--run-id", "")
    labels = {v: label_ref(env[v]) for v in env_vars(run_id) if v in env}
    name_labels, uid_labels = {"batch.kubernetes.io/job-name", "job-name"}, {"batch.kubernetes.io/controller-uid", "controller-uid"}
    check(any(l in uid_labels for l in labels.values()),
          f"{path}: --run-id {run_id!r} does not include the Job's uid (downward API label "
          f"batch.kubernetes.io/controller-uid): a re-created Job would meet the old one's rendezvous state")
    check(any(l in name_labels for l in labels.values()), f"{path}: --run-id {run_id!r} does not include the Job's name")
    rest = re.sub(r"\$\([A-Za-z_][A-Za-z0-9_]*\)", "", run_id)
    check(re.fullmatch(r"[A-Za-z0-9._-]*", rest) is not None, f"{path}: --run-id {run_id!r} has characters a run id cannot")
    longest = len(rest) + sum(len(job["metadata"]["name"]) if l in name_labels else UID_LEN for l in labels.values())
    check(longest <= RUN_ID_MAX, f"{path}: --run-id {run_id!r} is {longest} characters for this Job, more than {RUN_ID_MAX}")
    # Grace: the pod's termination grace fits in the spot pool's notice, and leaves elastic-run
    # its margin after --grace.
    grace = int(flags.get("--grace", "25"))  # elastic-run's default --grace is the loop's 25 s
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    check(tgps >= grace + GRACE_MARGIN_S, f"{path}: terminationGracePeriodSeconds {tgps} leaves less than "
                                          f"{GRACE_MARGIN_S} s over --grace {grace}")
    for label in sel:
        if label in SPOT_NOTICE_S:
            check(tgps <= SPOT_NOTICE_S[label], f"{path}: terminationGracePeriodSeconds {tgps} exceeds the "
                                                f"{SPOT_NOTICE_S[label]} s a {label} node gives its pods")
    check(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == int(flags.get("--nproc-per-node", 0)),
          f"{path}: GPU limit != --nproc-per-node")

    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    logs = mounts.get("/logs")
    check(logs is not None, f"{path}: /logs is not mounted")
    ckpt_arg = trainer[trainer.index("--ckpt") + 1] if "--ckpt" in trainer[:-1] else None
    if check(ckpt_arg is not None, f"{path}: the trainer gets no --ckpt"):
        ckpt_labels = {label_ref(env[v]) for v in env_vars(ckpt_arg) if v in env}
        check(ckpt_labels & name_labels and not ckpt_labels & uid_labels,
              f"{path}: the checkpoints ({ckpt_arg}) are not per Job name (a re-created Job resumes from them, "
              f"another Job must not)")
    check(logs is None or logs["name"] in volumes, f"{path}: /logs mounts no volume of the pod")
    in_bucket = bool(ckpt_arg) and ckpt_arg.startswith(("gs://", "s3://"))
    if in_bucket:
        # The keys: the pod's service account (Workload Identity, IRSA, Pod Identity) or a Secret.
        keyed = any(e.get("name", "").endswith(("ACCESS_KEY_ID", "SECRET_ACCESS_KEY")) for e in c.get("env", [])) or \
            any("secretRef" in f for f in c.get("envFrom", []))
        account = pod.get("serviceAccountName")
        check(account or keyed, f"{path}: checkpoints in {ckpt_arg} but no service account or keys for the bucket")
        if account and ckpt_arg.startswith("gs://") and not keyed:
            sas = [d for d in by_kind(docs, "ServiceAccount") if d["metadata"]["name"] == account]
            check(not sas or "iam.gke.io/gcp-service-account" in sas[0]["metadata"].get("annotations", {}),
                  f"{path}: service account {account} has no iam.gke.io/gcp-service-account (Workload Identity)")
            check(sel.get("iam.gke.io/gke-metadata-server-enabled") == "true",
                  f"{path}: gs:// through Workload Identity needs nodes with its metadata server")
    for what, mount_path in (("checkpoints", None if in_bucket else ckpt_arg),):
        if mount_path is None:
            continue
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


def check_sbatch(root):
    """What can be read off the script; tests/slurm/test_train_sbatch.sh runs it on a real cluster."""
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
    check(any(d.startswith("--signal=B:USR1@") for d in directives), f"{path}: no #SBATCH --signal=B:USR1@<seconds>")
    # srun answers SIGTERM/SIGINT by SIGKILLing every task: the notice must not go through it.
    check(not re.search(r"kill\s+-(TERM|INT|s\s+TERM)\s+\"?\$srun_pid", text),
          f"{path}: signals srun, which SIGKILLs the tasks; ask Slurm (scancel --signal=TERM) instead")
    check("scancel --signal=TERM" in text, f"{path}: the notice does not reach the steps through scancel --signal=TERM")
    check("scontrol requeue" in text, f"{path}: no scontrol requeue")
    check("|| true" not in text, f"{path}: a command's failure is ignored (|| true)")


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
    notice = min(SPOT_NOTICE_S.values())
    check(int(flags.get("--grace", 25)) + GRACE_MARGIN_S <= notice,
          f"{path}: --grace {flags.get('--grace')} (grace_seconds' default) leaves less than {GRACE_MARGIN_S} s of "
          f"a spot pool's {notice} s notice")
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
    # A bucket: the wrapper cannot list it; the output is the directory itself.
    d = os.path.join(tmp, "kfp-bucket")
    os.makedirs(d)
    vals = dict(values, checkpoint_dir="gs://elastic-checkpoints/run-7", log_dir=os.path.join(d, "logs"), run_id="r")
    out_file = os.path.join(d, "outputs", "last_checkpoint", "data")
    argv = [placeholder_value(a, vals, {"last_checkpoint": out_file}) for a in args]
    argv[argv.index("elastic-run")] = stub
    p = subprocess.Popen(argv, env=dict(os.environ, STUB_DIR=d, STUB_MODE="exit:0", STUB_CHECK_ETCD="0"),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    rc, out = run_bounded(p, 30)
    check(rc == 0, f"{path} [bucket]: the wrapper exited {rc}:\n{out}")
    got = open(out_file).read() if os.path.exists(out_file) else None
    check(got == "gs://elastic-checkpoints/run-7", f"{path} [bucket]: last_checkpoint output is {got!r}")


# Stand-ins for the parts of the KFP SDKs pipeline.py uses: they record every call, with the
# set_retry signature of KFP 1.8 (ContainerOp: policy), of KFP 2.x up to 2.17 (PipelineTask: no
# policy) and of 2.x with kubeflow/pipelines#13386 (policy). STUB_KFP says which.
STUB_KFP = {
    "kfp/__init__.py": r'''
import os
__version__ = {"v1": "1.8.22", "v2": "2.17.0", "v2-policy": "2.99.0"}[os.environ["STUB_KFP"]]
''',
    "kfp/_rec.py": r'''
import os, yaml
CALLS = []

def rec(name, *args, **kwargs):
    CALLS.append({"call": name, "args": [repr(a) for a in args], "kwargs": {k: repr(v) for k, v in kwargs.items()}})

class Task:
    def __init__(self, inputs):
        self.inputs = inputs
    @property
    def container(self):
        return self
    def __getattr__(self, name):
        def method(*args, **kwargs):
            rec(name, *args, **kwargs)
            return self
        return method

class TaskV1(Task):
    def set_retry(self, num_retries, policy=None, backoff_duration=None, backoff_factor=None, backoff_max_duration=None):
        assert policy in (None, "Always", "OnError", "OnFailure"), policy
        rec("set_retry", num_retries, policy=policy, backoff_duration=backoff_duration, backoff_factor=backoff_factor)
        return self

class TaskV2(Task):
    def set_retry(self, num_retries, backoff_duration=None, backoff_factor=None, backoff_max_duration=None):
        rec("set_retry", num_retries, backoff_duration=backoff_duration, backoff_factor=backoff_factor)
        return self

class TaskV2Policy(Task):
    def set_retry(self, num_retries, backoff_duration=None, backoff_factor=None, backoff_max_duration=None, policy=None):
        assert policy in (None, "Always", "OnError", "OnFailure", "OnTransientError"), policy
        rec("set_retry", num_retries, policy=policy, backoff_duration=backoff_duration, backoff_factor=backoff_factor)
        return self

def load_component_from_file(path):
    with open(path) as f:
        spec = yaml.safe_load(f)
    names = {i["name"] for i in spec["inputs"]}
    cls = {"v1": TaskV1, "v2": TaskV2, "v2-policy": TaskV2Policy}[os.environ["STUB_KFP"]]
    def factory(**kwargs):
        unknown = set(kwargs) - names
        assert not unknown, f"component.yaml has no inputs {sorted(unknown)}"
        rec("component", **kwargs)
        return cls(kwargs)
    return factory
''',
    "kfp/components.py": "from kfp._rec import load_component_from_file\n",
    "kfp/dsl.py": '''
PIPELINE_JOB_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"
def pipeline(*args, **kwargs):
    return lambda f: f
''',
    "kfp/kubernetes.py": '''
from kfp._rec import rec
def _op(name):
    def f(task, *args, **kwargs):
        rec(name, *args, **kwargs)
        return task
    return f
add_node_selector = _op("add_node_selector")
add_toleration = _op("add_toleration")
mount_pvc = _op("mount_pvc")
enable_shared_memory = _op("enable_shared_memory")
''',
    "kfp/gcp.py": '''
def use_preemptible_nodepool(*args, **kwargs):
    return "use_preemptible_nodepool"
''',
    "kubernetes/__init__.py": "",
    "kubernetes/client.py": '''
class _Obj:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
    def __repr__(self):
        return f"{type(self).__name__}({self.kwargs!r})"
class V1Toleration(_Obj): pass
class V1Volume(_Obj): pass
class V1VolumeMount(_Obj): pass
class V1PersistentVolumeClaimVolumeSource(_Obj): pass
''',
}

RUN_STUB_PIPELINE = r'''
import json, runpy, sys, warnings
from kfp import _rec
m = runpy.run_path(sys.argv[1])
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    build = m["build_pipeline_v1"] if sys.argv[2] == "v1" else m["build_pipeline"]
    build()()
print(json.dumps({"calls": _rec.CALLS, "warnings": [str(x.message) for x in w]}))
'''


def check_pipeline(root, tmp):
    path = os.path.join(root, "kubeflow", "pipeline.py")
    src = open(path).read()
    tree = ast.parse(src, path)
    top_imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name.split(".")[0] for n in top_imports for a in n.names} | \
            {n.module.split(".")[0] for n in top_imports if isinstance(n, ast.ImportFrom) and n.module}
    check("kfp" not in names, f"{path}: imports kfp at module level (it must import without kfp)")
    # Importable without kfp.
    r = subprocess.run([sys.executable, "-c", f"import runpy; m = runpy.run_path({path!r}); print(m['COMPONENT'])"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"{path}: does not import without running: {r.stderr.strip()}")

    # Built against stand-ins of each SDK: what does the pipeline ask of KFP?
    stubs = os.path.join(tmp, "kfp-stubs")
    for rel, text in STUB_KFP.items():
        os.makedirs(os.path.dirname(os.path.join(stubs, rel)), exist_ok=True)
        with open(os.path.join(stubs, rel), "w") as f:
            f.write(text)
    runner = os.path.join(tmp, "run_stub_pipeline.py")
    with open(runner, "w") as f:
        f.write(RUN_STUB_PIPELINE)
    notice = min(SPOT_NOTICE_S.values())
    with open(os.path.join(root, "kubeflow", "component.yaml")) as f:
        component_defaults = {i["name"]: i.get("default") for i in yaml.safe_load(f).get("inputs", [])}
    for flavour in ("v1", "v2", "v2-policy"):
        where = f"{path} [KFP {flavour} stand-in]"
        env = dict(os.environ, STUB_KFP=flavour, PYTHONPATH=stubs)
        r = subprocess.run([sys.executable, runner, path, "v1" if flavour == "v1" else "v2"], capture_output=True,
                           text=True, timeout=60, env=env)
        if not check(r.returncode == 0, f"{where}: building the pipeline failed:\n{r.stderr[-3000:]}"):
            continue
        out = json.loads(r.stdout.strip().splitlines()[-1])
        calls = out["calls"]
        by = {}
        for c in calls:
            by.setdefault(c["call"], []).append(c)
        retries = by.get("set_retry", [])
        want_policy = flavour != "v2"
        expected = "set_retry(5, policy='Always')" if want_policy else "set_retry(5)"
        check(len(retries) == 1 and retries[0]["args"] == ["5"]
              and retries[0]["kwargs"].get("policy") == ("'Always'" if want_policy else None),
              f"{where}: expected one {expected}, got {retries}")
        if not want_policy:
            check(any("policy" in w for w in out["warnings"]),
                  f"{where}: an SDK whose set_retry takes no policy must be warned about (preempted pods deleted "
                  f"with their node would not be retried); warnings: {out['warnings']}")
        comp = (by.get("component") or [{"kwargs": {}}])[0]["kwargs"]
        run_id = comp.get("run_id", "")
        check(run_id in ("'{{$.pipeline_job_uuid}}'", "'{{workflow.uid}}'"),
              f"{where}: run_id is {run_id}, not the pipeline run's id (unique per run, the same for its retries)")
        grace = int(comp["grace_seconds"]) if "grace_seconds" in comp else int(component_defaults.get("grace_seconds", 25))
        check(grace + GRACE_MARGIN_S <= notice, f"{where}: grace_seconds {grace} leaves less than {GRACE_MARGIN_S} s "
                                                f"of a spot pool's {notice} s notice")
        if flavour == "v1":
            check("'use_preemptible_nodepool'" in [a for c in by.get("apply", []) for a in c["args"]],
                  f"{where}: no gcp.use_preemptible_nodepool()")
        else:
            check(any("spot" in c["kwargs"].get("label_key", "") for c in by.get("add_node_selector", [])),
                  f"{where}: no spot node selector")
            check(any("spot" in c["kwargs"].get("key", "") for c in by.get("add_toleration", [])),
                  f"{where}: no spot toleration")
    # Checkpoints in a bucket by default, so a retried pod finds them on any node without a
    # ReadWriteMany volume; a bucket the step's service account can write.
    defaults = re.findall(r'checkpoint_dir: str = (\w+|"[^"]*")', open(path).read())
    consts = dict(re.findall(r'^(\w+) = "([^"]*)"', open(path).read(), re.M))
    resolved = [consts.get(d, d.strip('"')) for d in defaults]
    check(len(resolved) == 2 and all(d.startswith(("gs://", "s3://")) for d in resolved),
          f"{path}: the pipelines' checkpoint_dir defaults {resolved} are not buckets")
    check(str(component_defaults.get("checkpoint_dir", "")).startswith(("gs://", "s3://")),
          f"component.yaml: checkpoint_dir defaults to {component_defaults.get('checkpoint_dir')!r}, not a bucket")
    try:
        import kfp  # noqa: F401
        notes.append("kfp is installed: compiling pipeline.py")
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([sys.executable, path, os.path.join(d, "p.yaml")], capture_output=True, text=True, timeout=120)
            check(r.returncode == 0, f"{path}: compiling failed: {r.stderr[-2000:]}")
    except ImportError:
        notes.append("kfp not installed: pipeline.py built against stand-ins of the KFP SDKs, not compiled")


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
                         ("schemas", lambda: check_schemas(root)),
                         ("kubernetes", lambda: check_etcd(root, check_job(root))),
                         ("kubeflow component", lambda: check_component(root, tmp)),
                         ("kubeflow pipeline", lambda: check_pipeline(root, tmp)),
                         ("slurm", lambda: check_sbatch(root)),
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
