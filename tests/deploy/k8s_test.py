"""deploy/k8s/mpijob.yaml: the fields the Kubeflow MPI operator (kubeflow.org/v2beta1) needs,
and that they agree with each other and with the repository.

No cluster here, so this checks the manifest, not a deployment: apiVersion/kind/name, the
Launcher and Worker replica specs (replicas, containers with image and command), the MPI
implementation, slotsPerWorker, runPolicy, sshAuthMountPath; the launcher's distdld-run
command (rank count = pods in the hostfile x slotsPerWorker, --listen port = the gRPC
probes' port = the container port the Service targets; the spec file exists in deploy/specs
with that world size; the checkpoint dir on a volume every pod mounts from a ReadWriteMany
claim defined here); the Service selects the launcher pod by the labels the operator sets.
Mutated copies of the manifest must fail the same checks (the test can fail).
"""
import copy
import json
import os
import re
import sys

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed (apt-get install python3-yaml)")
    sys.exit(7)

OPERATOR_LABELS = ("training.kubeflow.org/job-name", "training.kubeflow.org/job-role")


def check(docs, source):
    """The problems found, as sentences (empty: the manifest is consistent)."""
    bad = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    jobs = by_kind.get("MPIJob", [])
    if len(jobs) != 1:
        return ["expected one MPIJob, found %d" % len(jobs)]
    job = jobs[0]
    if job.get("apiVersion") != "kubeflow.org/v2beta1":
        bad.append("MPIJob apiVersion %r is not kubeflow.org/v2beta1" % job.get("apiVersion"))
    name = (job.get("metadata") or {}).get("name")
    if not name or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
        bad.append("metadata.name %r is not a DNS label" % name)
    spec = job.get("spec") or {}
    slots = spec.get("slotsPerWorker")
    if type(slots) is not int or slots < 1:
        bad.append("slotsPerWorker %r is not a positive int" % slots)
        slots = 1
    if spec.get("mpiImplementation") != "OpenMPI":
        bad.append("mpiImplementation %r is not OpenMPI (the image's MPI)" % spec.get("mpiImplementation"))
    if not str(spec.get("sshAuthMountPath", "")).startswith("/"):
        bad.append("sshAuthMountPath %r is not an absolute path" % spec.get("sshAuthMountPath"))
    rp = spec.get("runPolicy") or {}
    if rp.get("cleanPodPolicy") not in ("None", "Running", "All"):
        bad.append("runPolicy.cleanPodPolicy %r is not None/Running/All" % rp.get("cleanPodPolicy"))
    if type(rp.get("backoffLimit")) is not int or rp["backoffLimit"] < 0:
        bad.append("runPolicy.backoffLimit %r is not an int >= 0" % rp.get("backoffLimit"))
    replicas = spec.get("mpiReplicaSpecs") or {}
    if set(replicas) != {"Launcher", "Worker"}:
        return bad + ["mpiReplicaSpecs has %s, not Launcher and Worker" % sorted(replicas)]
    pods = {}
    for role, rs in replicas.items():
        n = rs.get("replicas")
        if type(n) is not int or n < (1 if role == "Launcher" else 0) or (role == "Launcher" and n != 1):
            bad.append("%s replicas %r invalid" % (role, n))
        if rs.get("restartPolicy", "Never") not in ("Always", "OnFailure", "Never", "ExitCode"):
            bad.append("%s restartPolicy %r invalid" % (role, rs.get("restartPolicy")))
        tspec = ((rs.get("template") or {}).get("spec")) or {}
        cs = tspec.get("containers") or []
        if not cs:
            bad.append("%s template has no containers" % role)
        for c in cs:
            if not isinstance(c.get("image"), str) or not c["image"]:
                bad.append("%s container %r has no image" % (role, c.get("name")))
            cmd = c.get("command")
            if not (isinstance(cmd, list) and cmd and all(isinstance(x, str) for x in cmd)):
                bad.append("%s container %r has no command list" % (role, c.get("name")))
        vols = {v.get("name"): v for v in tspec.get("volumes") or []}
        for c in cs:
            for m in c.get("volumeMounts") or []:
                if m.get("name") not in vols:
                    bad.append("%s mounts %r, which is not a volume of the pod" % (role, m.get("name")))
        pods[role] = (rs, tspec, cs, vols)
    if bad:
        return bad

    # The launcher's command: distdld-run with --np, --listen, --model, --checkpoint-dir.
    _, lspec, lcs, lvols = pods["Launcher"]
    text = " ".join(" ".join(c["command"] + list(c.get("args") or [])) for c in lcs)
    text = text.replace("\\\n", " ")

    def opt(flag):
        m = re.search(r"%s[ =](\S+)" % re.escape(flag), text)
        return m.group(1) if m else None
    if "distdld-run" not in text and "distdld" not in text:
        bad.append("the launcher does not run distdld")
    np_, listen, model, ckdir = opt("--np"), opt("--listen"), opt("--model"), opt("--checkpoint-dir")
    workers = replicas["Worker"]["replicas"]
    hosts = workers + (1 if spec.get("runLauncherAsWorker") is True else 0)
    if np_ is None or not np_.isdigit() or int(np_) != hosts * slots:
        bad.append("--np %s is not (workers %d%s) x slotsPerWorker %d = %d" %
                   (np_, workers, " + launcher" if hosts > workers else "", slots, hosts * slots))
    port = None
    if listen is None or not re.fullmatch(r"0\.0\.0\.0:\d+|\[::\]:\d+", listen):
        bad.append("--listen %r does not listen on every interface of the pod with a fixed port" % listen)
    else:
        port = int(listen.rsplit(":", 1)[1])
    # distdld refuses a non-loopback --listen without tokens or TLS (unless --insecure): the
    # token file must come from a Secret mounted into the launcher, not readable by others.
    token_file = opt("--token-file")
    if token_file is None and opt("--tls-cert") is None:
        bad.append("--listen %s without --token-file or --tls-cert: distdld refuses to start" % listen)
    elif token_file is not None:
        mounted = False
        for c in lcs:
            for m in c.get("volumeMounts") or []:
                v = lvols.get(m.get("name")) or {}
                sec = v.get("secret")
                if sec and token_file.startswith(m.get("mountPath", "").rstrip("/") + "/"):
                    mounted = True
                    if sec.get("defaultMode", 0o644) & 0o007:
                        bad.append("the token secret's defaultMode %o lets others read it "
                                   "(distdld refuses it)" % sec.get("defaultMode", 0o644))
        if not mounted:
            bad.append("--token-file %s is not inside a mounted Secret volume" % token_file)
    if spec.get("runLauncherAsWorker") is not True:
        bad.append("rank 0 serves gRPC: without runLauncherAsWorker it is not in the launcher pod")
    if "/etc/mpi/hostfile" not in text or "--hostfile" not in text:
        bad.append("the launcher does not put itself first in the operator's hostfile (rank 0 there)")
    if model is None:
        bad.append("no --model in the launcher command")
    else:
        local = os.path.join(source, "deploy", "specs", os.path.basename(model))
        if not model.startswith("/opt/distdl/share/distdl/specs/") or not os.path.isfile(local):
            bad.append("--model %s is not an installed deploy/specs file" % model)
        else:
            with open(local) as f:
                ws = json.load(f).get("world_size")
            if np_ is None or ws != int(np_):
                bad.append("%s has world size %s, the job runs %s ranks" % (model, ws, np_))
    container_ports = {}
    for c in lcs:
        for p in c.get("ports") or []:
            container_ports[p.get("name")] = p.get("containerPort")
        for kind in ("readinessProbe", "livenessProbe"):
            probe = (c.get(kind) or {}).get("grpc")
            if not probe:
                bad.append("launcher container %r has no gRPC %s" % (c.get("name"), kind))
            elif port is not None and probe.get("port") != port:
                bad.append("%s gRPC port %r is not the --listen port %s" % (kind, probe.get("port"), port))
    if port is not None and port not in container_ports.values():
        bad.append("no launcher containerPort %s" % port)

    # Checkpoints: every pod mounts the same ReadWriteMany claim at the --checkpoint-dir.
    claims = {d["metadata"]["name"]: d for d in by_kind.get("PersistentVolumeClaim", [])}
    for role, (_, tspec, cs, vols) in pods.items():
        found = False
        for c in cs:
            for m in c.get("volumeMounts") or []:
                if ckdir and (ckdir == m["mountPath"] or ckdir.startswith(m["mountPath"].rstrip("/") + "/")):
                    claim = (vols[m["name"]].get("persistentVolumeClaim") or {}).get("claimName")
                    if claim not in claims:
                        bad.append("%s: checkpoint volume claim %r is not defined here" % (role, claim))
                    elif "ReadWriteMany" not in claims[claim]["spec"].get("accessModes", []):
                        bad.append("claim %s is not ReadWriteMany (every rank writes a shard)" % claim)
                    found = True
        if not found:
            bad.append("%s does not mount the checkpoint dir %s" % (role, ckdir))

    # The Service: selects the launcher pod by labels it will carry; targets the gRPC port.
    svcs = by_kind.get("Service", [])
    if len(svcs) != 1:
        return bad + ["expected one Service, found %d" % len(svcs)]
    svc = svcs[0]
    labels = dict(((pods["Launcher"][0].get("template") or {}).get("metadata") or {}).get("labels") or {})
    labels.update({OPERATOR_LABELS[0]: name, OPERATOR_LABELS[1]: "launcher"})
    sel = (svc.get("spec") or {}).get("selector") or {}
    if not sel or any(labels.get(k) != v for k, v in sel.items()):
        bad.append("Service selector %s does not match the launcher pod's labels %s" % (sel, labels))
    if sel.get(OPERATOR_LABELS[1]) != "launcher" or sel.get(OPERATOR_LABELS[0]) != name:
        bad.append("Service selector does not pin this job's launcher (%s)" % sel)
    for p in (svc.get("spec") or {}).get("ports") or []:
        target = p.get("targetPort", p.get("port"))
        target = container_ports.get(target, target) if isinstance(target, str) else target
        if target != port:
            bad.append("Service port %s targets %r, not the gRPC port %s" % (p.get("port"), target, port))
    return bad


def main():
    source = sys.argv[sys.argv.index("--source") + 1]
    path = os.path.join(source, "deploy", "k8s", "mpijob.yaml")
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    print("%s: %s" % (path, ", ".join("%s/%s" % (d["kind"], d["metadata"]["name"]) for d in docs)))
    problems = check(docs, source)
    for p in problems:
        print("problem: " + p)
    if problems:
        print("FAIL: %d problem(s) in %s" % (len(problems), path))
        return 1
    print("ok: the manifest is consistent")

    # The checks can fail: each mutation must be caught.
    def job(ds):
        return next(d for d in ds if d["kind"] == "MPIJob")

    def launcher_c(ds):
        return job(ds)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]

    def svc(ds):
        return next(d for d in ds if d["kind"] == "Service")
    mutations = {
        "slotsPerWorker 3": lambda ds: job(ds)["spec"].update(slotsPerWorker=3),
        "slotsPerWorker '2'": lambda ds: job(ds)["spec"].update(slotsPerWorker="2"),
        "2 workers": lambda ds: job(ds)["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=2),
        "probe port 50052": lambda ds: launcher_c(ds)["readinessProbe"]["grpc"].update(port=50052),
        "selector role worker": lambda ds: svc(ds)["spec"]["selector"].update(
            {"training.kubeflow.org/job-role": "worker"}),
        "no image": lambda ds: launcher_c(ds).pop("image"),
        "apiVersion v1": lambda ds: job(ds).update(apiVersion="kubeflow.org/v1"),
        "no Worker": lambda ds: job(ds)["spec"]["mpiReplicaSpecs"].pop("Worker"),
        "model lenet5-2": lambda ds: launcher_c(ds).update(command=[
            x.replace("lenet5-4.json", "lenet5-2.json") for x in launcher_c(ds)["command"]]),
    }
    for what, mutate in mutations.items():
        ds = copy.deepcopy(docs)
        mutate(ds)
        found = check(ds, source)
        if not found:
            print("FAIL: the mutation '%s' passed the checks" % what)
            return 1
        print("ok: mutation '%s' caught: %s" % (what, found[0]))
    dockerfile = os.path.join(source, "deploy", "k8s", "Dockerfile")
    with open(dockerfile) as f:
        df = f.read()
    if "deploy/systemd/install.sh" not in df or "tini" not in df or "openssh-server" not in df:
        print("FAIL: %s does not install distdl under /opt/distdl with tini and sshd" % dockerfile)
        return 1
    print("ok: the Dockerfile installs /opt/distdl, tini and sshd (it is not built here: no docker)")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
